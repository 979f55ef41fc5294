"""One record written with librdkafka's C API (ctypes), for what the Python and Java clients
cannot write: a header name that is not UTF-8, as kcat, Go or C producers can."""

from __future__ import annotations

import ctypes
from pathlib import Path

import confluent_kafka

_TOPIC, _PARTITION, _VALUE, _KEY, _MSGFLAGS, _HEADER = 1, 3, 4, 5, 7, 9  # rd_kafka_vtype_t
_MSG_F_COPY = 0x2


class _Mem(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_void_p), ("size", ctypes.c_size_t)]


class _Header(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("val", ctypes.c_void_p), ("size", ctypes.c_ssize_t)]


class _Value(ctypes.Union):
    _fields_ = [("cstr", ctypes.c_char_p), ("mem", _Mem), ("header", _Header),
                ("i", ctypes.c_int), ("pad", ctypes.c_char * 64)]


class _VU(ctypes.Structure):  # rd_kafka_vu_t
    _fields_ = [("vtype", ctypes.c_int), ("u", _Value)]


def _librdkafka() -> ctypes.CDLL:
    libs = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    lib = ctypes.CDLL(str(next(libs.glob("librdkafka*.so*"))))
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                      ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_produceva.restype = ctypes.c_void_p
    lib.rd_kafka_produceva.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    lib.rd_kafka_flush.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    return lib


def produce_with_header(bootstrap: str, topic: str, *, key: bytes, value: bytes,
                        header_name: bytes, header_value: bytes, partition: int = -1) -> None:
    """Write one record whose one header is named by the bytes `header_name`, as they are;
    `partition` -1 lets librdkafka choose."""
    lib = _librdkafka()
    error = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    lib.rd_kafka_conf_set(conf, b"bootstrap.servers", bootstrap.encode(), error, 512)
    producer = lib.rd_kafka_new(0, conf, error, 512)  # 0: RD_KAFKA_PRODUCER
    assert producer, error.value
    buffers = [ctypes.create_string_buffer(data, len(data)) for data in (key, value, header_value)]
    fields = (_VU * 6)()
    fields[0].vtype, fields[0].u.cstr = _TOPIC, topic.encode()
    for index, (vtype, buffer, data) in enumerate(((_KEY, buffers[0], key),
                                                   (_VALUE, buffers[1], value)), start=1):
        fields[index].vtype = vtype
        fields[index].u.mem = _Mem(ctypes.cast(buffer, ctypes.c_void_p), len(data))
    fields[3].vtype = _HEADER
    fields[3].u.header = _Header(header_name, ctypes.cast(buffers[2], ctypes.c_void_p),
                                 len(header_value))
    fields[4].vtype, fields[4].u.i = _MSGFLAGS, _MSG_F_COPY
    fields[5].vtype, fields[5].u.i = _PARTITION, partition
    try:
        assert not lib.rd_kafka_produceva(producer, fields, 6), "rd_kafka_produceva failed"
        assert lib.rd_kafka_flush(producer, 10_000) == 0, "not delivered in 10 s"
    finally:
        lib.rd_kafka_destroy(producer)
