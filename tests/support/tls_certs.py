#!/usr/bin/python3
"""Certificates for HTTPS tests, made with Debian's openssl: a certificate authority of the test's
own and a server certificate it signs for 127.0.0.1 and localhost (subjectAltName), so a client
trusts the server only when told to trust that authority.

    from tls_certs import make_certificates
    c = make_certificates("/tmp/x/tls")   # {"ca": PEM path, "cert": ..., "key": ..., "other_ca": ...}

"other_ca" is a second authority that signed nothing the server holds: trusting it alone must
fail. Standard library and /usr/bin/openssl only; P-256 keys (fast to make), valid for two days.
"""
import os
import subprocess

OPENSSL = "/usr/bin/openssl"

SERVER_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
"""


def _openssl(*args, cwd):
    r = subprocess.run([OPENSSL, *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed ({r.returncode}):\n{r.stderr}")


def _authority(folder, name, subject):
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", name + ".key", "-out", name + ".pem", "-days", "2", "-subj", subject,
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=folder)
    return os.path.join(folder, name + ".pem")


def make_certificates(folder):
    """Makes (or remakes) the authorities and the server's key and certificate in `folder`;
    returns their paths."""
    os.makedirs(folder, exist_ok=True)
    ca = _authority(folder, "ca", "/CN=crucible test authority")
    other = _authority(folder, "other-ca", "/CN=crucible test authority that signed nothing here")
    with open(os.path.join(folder, "server.ext"), "w") as f:
        f.write(SERVER_EXTENSIONS)
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=127.0.0.1", cwd=folder)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "2", "-extfile", "server.ext", cwd=folder)
    return {"ca": ca, "other_ca": other, "cert": os.path.join(folder, "server.pem"),
            "key": os.path.join(folder, "server.key")}
