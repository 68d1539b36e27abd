#!/usr/bin/python3
"""An independent reader of TensorBoard event files, for the tests.

Nothing here is shared with crucible's writer: the CRC-32C comes from Debian's python3-crc32c,
the messages are parsed by Debian's python3-protobuf from descriptors built below with the field
numbers of tensorflow/core/util/event.proto and tensorflow/core/framework/summary.proto,
tensor.proto and tensor_shape.proto, tensorboard/plugins/hparams/plugin_data.proto and api.proto,
and google/protobuf/struct.proto.

Usage: read_tfevents.py DIR   prints one JSON object:
  {"files": [name, ...], "versions": [...], "scalars": [[tag, step, value], ...],
   "texts": [[tag, step, text, plugin], ...],
   "histograms": [[tag, step, min, max, num, sum, sum_squares, [limits], [counts]], ...],
   "hparams": [[tag, step, {...}], ...]}  (experiment: {"hparams": [[name, type]], "metrics":
   [[group, tag, dataset_type]]}; session start: {"values": {name: value}, "start": secs};
   session end: {"status": n, "end": secs})
in file-name order, then record order. Exits 1 naming the file and byte offset on a CRC that
does not match, a torn record, or a message protobuf cannot parse.
"""
import json
import os
import struct
import sys

import crc32c
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto


def build_messages():
    fdp = descriptor_pb2.FileDescriptorProto(name="crucible_test_event.proto", package="tbtest", syntax="proto2")

    def message(name, fields):
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, label, type_name, packed in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = ".tbtest." + type_name
            if packed:
                f.options.packed = True

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    message("Event", [("wall_time", 1, F.TYPE_DOUBLE, opt, None, False),
                      ("step", 2, F.TYPE_INT64, opt, None, False),
                      ("file_version", 3, F.TYPE_STRING, opt, None, False),
                      ("summary", 5, F.TYPE_MESSAGE, opt, "Summary", False)])
    message("Summary", [("value", 1, F.TYPE_MESSAGE, rep, "Value", False)])
    message("Value", [("tag", 1, F.TYPE_STRING, opt, None, False),
                      ("simple_value", 2, F.TYPE_FLOAT, opt, None, False),
                      ("histo", 5, F.TYPE_MESSAGE, opt, "HistogramProto", False),
                      ("tensor", 8, F.TYPE_MESSAGE, opt, "TensorProto", False),
                      ("metadata", 9, F.TYPE_MESSAGE, opt, "SummaryMetadata", False)])
    message("SummaryMetadata", [("plugin_data", 1, F.TYPE_MESSAGE, opt, "PluginData", False)])
    message("PluginData", [("plugin_name", 1, F.TYPE_STRING, opt, None, False),
                           ("content", 2, F.TYPE_BYTES, opt, None, False)])
    message("HistogramProto", [("min", 1, F.TYPE_DOUBLE, opt, None, False),
                               ("max", 2, F.TYPE_DOUBLE, opt, None, False),
                               ("num", 3, F.TYPE_DOUBLE, opt, None, False),
                               ("sum", 4, F.TYPE_DOUBLE, opt, None, False),
                               ("sum_squares", 5, F.TYPE_DOUBLE, opt, None, False),
                               ("bucket_limit", 6, F.TYPE_DOUBLE, rep, None, True),
                               ("bucket", 7, F.TYPE_DOUBLE, rep, None, True)])
    message("TensorProto", [("dtype", 1, F.TYPE_INT32, opt, None, False),
                            ("tensor_shape", 2, F.TYPE_MESSAGE, opt, "TensorShapeProto", False),
                            ("string_val", 8, F.TYPE_BYTES, rep, None, False)])
    message("TensorShapeProto", [("unknown_rank", 3, F.TYPE_BOOL, opt, None, False)])
    message("HParamsPluginData", [("version", 1, F.TYPE_INT32, opt, None, False),
                                  ("experiment", 2, F.TYPE_MESSAGE, opt, "Experiment", False),
                                  ("session_start_info", 3, F.TYPE_MESSAGE, opt, "SessionStartInfo", False),
                                  ("session_end_info", 4, F.TYPE_MESSAGE, opt, "SessionEndInfo", False)])
    message("Experiment", [("hparam_infos", 4, F.TYPE_MESSAGE, rep, "HParamInfo", False),
                           ("metric_infos", 5, F.TYPE_MESSAGE, rep, "MetricInfo", False)])
    message("HParamInfo", [("name", 1, F.TYPE_STRING, opt, None, False),
                           ("type", 4, F.TYPE_INT32, opt, None, False)])
    message("MetricInfo", [("name", 1, F.TYPE_MESSAGE, opt, "MetricName", False),
                           ("dataset_type", 5, F.TYPE_INT32, opt, None, False)])
    message("MetricName", [("group", 1, F.TYPE_STRING, opt, None, False),
                           ("tag", 2, F.TYPE_STRING, opt, None, False)])
    message("SessionStartInfo", [("hparams", 1, F.TYPE_MESSAGE, rep, "HParamsEntry", False),
                                 ("start_time_secs", 5, F.TYPE_DOUBLE, opt, None, False)])
    message("HParamsEntry", [("key", 1, F.TYPE_STRING, opt, None, False),
                             ("value", 2, F.TYPE_MESSAGE, opt, "StructValue", False)])
    message("StructValue", [("number_value", 2, F.TYPE_DOUBLE, opt, None, False),
                            ("string_value", 3, F.TYPE_STRING, opt, None, False),
                            ("bool_value", 4, F.TYPE_BOOL, opt, None, False)])
    message("SessionEndInfo", [("status", 1, F.TYPE_INT32, opt, None, False),
                               ("end_time_secs", 2, F.TYPE_DOUBLE, opt, None, False)])
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    factory = message_factory.MessageFactory(pool)
    get = getattr(message_factory, "GetMessageClass", None)
    def cls(name):
        desc = pool.FindMessageTypeByName("tbtest." + name)
        return get(desc) if get else factory.GetPrototype(desc)
    return cls("Event"), cls("HParamsPluginData")


def masked(data):
    crc = crc32c.crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def fail(path, offset, what):
    print(f"{path}: byte {offset}: {what}", file=sys.stderr)
    sys.exit(1)


def main():
    root = sys.argv[1]
    Event, HParams = build_messages()
    out = {"files": [], "versions": [], "scalars": [], "texts": [], "histograms": [], "hparams": []}
    for name in sorted(os.listdir(root)):
        if not name.startswith("events.out.tfevents."):
            continue
        path = os.path.join(root, name)
        out["files"].append(name)
        data = open(path, "rb").read()
        off = 0
        while off < len(data):
            if len(data) - off < 12:
                fail(path, off, "torn record header")
            (length,) = struct.unpack_from("<Q", data, off)
            (len_crc,) = struct.unpack_from("<I", data, off + 8)
            if len_crc != masked(data[off:off + 8]):
                fail(path, off, "length CRC-32C does not match")
            body = data[off + 12:off + 12 + length]
            if len(body) != length or off + 16 + length > len(data):
                fail(path, off, "torn record")
            (body_crc,) = struct.unpack_from("<I", data, off + 12 + length)
            if body_crc != masked(body):
                fail(path, off, "record CRC-32C does not match")
            e = Event()
            try:
                e.ParseFromString(body)
            except Exception as exc:  # noqa: BLE001 - any parse failure is the finding
                fail(path, off, f"protobuf cannot parse the event: {exc}")
            if e.HasField("file_version"):
                out["versions"].append(e.file_version)
            for v in e.summary.value:
                if v.HasField("simple_value"):
                    out["scalars"].append([v.tag, e.step, v.simple_value])
                elif v.HasField("histo"):
                    h = v.histo
                    out["histograms"].append([v.tag, e.step, h.min, h.max, h.num, h.sum, h.sum_squares,
                                              list(h.bucket_limit), list(h.bucket)])
                elif v.metadata.plugin_data.plugin_name == "hparams":
                    d = HParams()
                    d.ParseFromString(v.metadata.plugin_data.content)
                    if d.HasField("experiment"):
                        x = d.experiment
                        info = {"hparams": [[h.name, h.type] for h in x.hparam_infos],
                                "metrics": [[m.name.group, m.name.tag, m.dataset_type] for m in x.metric_infos]}
                    elif d.HasField("session_start_info"):
                        values = {}
                        for entry in d.session_start_info.hparams:
                            kind = [f.name for f, _ in entry.value.ListFields()]
                            if len(kind) != 1:
                                fail(path, off, f"hparam '{entry.key}' holds {kind}, not one value")
                            values[entry.key] = getattr(entry.value, kind[0])
                        info = {"values": values, "start": d.session_start_info.start_time_secs}
                    elif d.HasField("session_end_info"):
                        info = {"status": d.session_end_info.status, "end": d.session_end_info.end_time_secs}
                    else:
                        fail(path, off, f"hparams value '{v.tag}' holds no experiment or session info")
                    out["hparams"].append([v.tag, e.step, info])
                elif v.HasField("tensor"):
                    out["texts"].append([v.tag, e.step, b"".join(v.tensor.string_val).decode(),
                                         v.metadata.plugin_data.plugin_name])
                else:
                    fail(path, off, f"summary value '{v.tag}' holds none of scalar, histogram, text")
            off += 16 + length
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
