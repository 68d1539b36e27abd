#!/usr/bin/python3
"""A point-to-point link with delay and random loss, in user space: what `tc qdisc ... netem
delay D loss P` does to a veth, for kernels built without netem (CONFIG_NET_SCH_NETEM unset, as
on some test machines).

It opens two TUN devices (raw IP packets, no header) and forwards every packet read from one to
the other, D milliseconds later, dropping each with probability P (its own seeded stream, so a
run's losses repeat). The network test moves each device into one node's namespace and gives
them addresses. Hand-written because no Debian package emulates a lossy link without netem.

  lossy_link.py --devs ct0 ct1 --delay-ms 50 --loss 0.01 --ready FILE --stats FILE

FILE --ready: written once both devices exist (the test then moves them). --stats: JSON
{"forwarded": [a→b, b→a], "dropped": [a→b, b→a]} rewritten each second and at SIGTERM.
"""
import argparse
import fcntl
import heapq
import json
import os
import random
import select
import signal
import struct
import sys
import time

TUNSETIFF = 0x400454CA
IFF_TUN = 0x0001
IFF_NO_PI = 0x1000


def open_tun(name):
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    os.set_blocking(fd, False)
    return fd


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--devs", nargs=2, required=True)
    p.add_argument("--delay-ms", type=float, default=50)
    p.add_argument("--loss", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--ready", required=True)
    p.add_argument("--stats", required=True)
    a = p.parse_args()

    fds = [open_tun(n) for n in a.devs]
    with open(a.ready, "w") as f:
        f.write("ready\n")
    rng = random.Random(a.seed)
    delay = a.delay_ms / 1000.0
    forwarded, dropped = [0, 0], [0, 0]
    queue = []  # (due, sequence, destination fd, packet)
    sequence = 0
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))

    def write_stats():
        tmp = a.stats + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"forwarded": forwarded, "dropped": dropped}, f)
        os.replace(tmp, a.stats)

    last_stats = 0.0
    while not stopping:
        now = time.monotonic()
        while queue and queue[0][0] <= now:
            _, _, dst, packet = heapq.heappop(queue)
            try:
                os.write(dst, packet)
            except OSError:
                pass  # the device is down (a cut link): the packet is lost, as on a wire
        timeout = max(0.0, queue[0][0] - now) if queue else 0.5
        try:
            readable, _, _ = select.select(fds, [], [], min(timeout, 0.5))
        except InterruptedError:
            continue
        for i, fd in enumerate(fds):
            if fd not in readable:
                continue
            for _ in range(256):
                try:
                    packet = os.read(fd, 65536)
                except (BlockingIOError, OSError):
                    break
                if rng.random() < a.loss:
                    dropped[i] += 1
                    continue
                forwarded[i] += 1
                sequence += 1
                heapq.heappush(queue, (time.monotonic() + delay, sequence, fds[1 - i], packet))
        if now - last_stats >= 1.0:
            write_stats()
            last_stats = now
    write_stats()
    return 0


if __name__ == "__main__":
    sys.exit(main())
