"""A real S3-compatible endpoint for tests and benchmarks: moto's server on 127.0.0.1,
and an HTTP proxy in front of it that injects throttling and counts what is sent.

Why a proxy: s3fs and botocore hide the wire; what object storage bills and throttles
is requests and bytes, so the tests inject faults and the benchmarks count bytes where a
real bucket would see them. Needs ``moto[server]`` and ``boto3`` (the ``test`` extra).
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlparse

__all__ = ["FaultProxy", "parquet_gets", "s3_server"]


@contextlib.contextmanager
def s3_server(bucket: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """A real S3-compatible server (moto's) on 127.0.0.1 holding an empty ``bucket``;
    yields ``(endpoint_url, storage_options)`` for s3fs, as a user would pass them."""
    import logging

    from moto.server import ThreadedMotoServer

    # one werkzeug log line per request would drown a benchmark's or a test's output
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        import boto3

        boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
            region_name="us-east-1",
        ).create_bucket(Bucket=bucket)
        options = {
            "key": "testing",
            "secret": "testing",
            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"},
        }
        yield endpoint, options
    finally:
        server.stop()


def parquet_gets(method: str, path: str) -> bool:
    """GETs of Parquet objects (not listings, not the index): the default fault target."""
    return method == "GET" and path.split("?")[0].endswith(".parquet")


class FaultProxy:
    """An HTTP proxy in front of the S3 server that answers the first ``fail`` requests
    chosen by ``throttle`` (default: GETs of Parquet objects; ``lambda method, path:
    method == "GET"`` adds listings) with 503 SlowDown (S3's throttling reply), as a busy
    bucket does. (botocore and s3fs retry throttling themselves; the tests turn those
    retries down so the component's own retries, for what outlasts them, are what is
    exercised.)

    ``throttle=lambda method, path: method == "PUT" and path.endswith(".merged")`` makes
    a PUT storm on an aggregation round's result.

    ``flip``: the next ``flip`` ranged GETs of Parquet objects get one bit of their body
    flipped (the middle byte), as a damaged transfer would; ``flipped`` counts them.

    It also counts what reaches the client: ``bytes_out`` (response bodies, injected
    errors included), ``gets`` and ``requests``; ``reset_counts()`` zeroes them. Point a
    reader at ``url`` instead of the server's endpoint.
    """

    SLOWDOWN = (
        b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
        b"<Message>Please reduce your request rate.</Message></Error>"
    )

    def __init__(
        self,
        target: str,
        fail: int = 0,
        throttle: Callable[[str, str], bool] = parquet_gets,
        flip: int = 0,
    ):
        up = urlparse(target)
        proxy = self
        self.fail, self.failed, self.throttle = fail, 0, throttle
        self.flip, self.flipped = flip, 0
        self.lock = threading.Lock()
        self.bytes_out = self.gets = self.requests = 0

        class Handler(http.server.BaseHTTPRequestHandler):
            # HTTP/1.1: botocore uploads with "Expect: 100-continue" and waits for the 100
            protocol_version = "HTTP/1.1"

            def _forward(self) -> None:
                body = None
                if "Content-Length" in self.headers:
                    body = self.rfile.read(int(self.headers["Content-Length"]))
                if proxy.throttle(self.command, self.path):
                    with proxy.lock:
                        inject = proxy.failed < proxy.fail
                        proxy.failed += inject
                    if inject:
                        self.send_response(503)
                        self.send_header("Content-Type", "application/xml")
                        self.send_header("Content-Length", str(len(proxy.SLOWDOWN)))
                        self.end_headers()
                        proxy._count(self.command, len(proxy.SLOWDOWN))
                        self.wfile.write(proxy.SLOWDOWN)
                        return
                # a hang guard only: the server answers at once, but on a loaded machine
                # a request may wait long for the CPU
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=300)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "expect"}
                conn.request(self.command, self.path, body, headers)
                resp = conn.getresponse()
                data = resp.read()
                if resp.status == 206 and parquet_gets(self.command, self.path) and data:
                    with proxy.lock:
                        damage = proxy.flipped < proxy.flip
                        proxy.flipped += damage
                    if damage:
                        mid = len(data) // 2
                        data = data[:mid] + bytes([data[mid] ^ 0x10]) + data[mid + 1 :]
                head = self.command == "HEAD"  # its Content-Length is the object's size
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                length = resp.getheader("Content-Length", "0") if head else str(len(data))
                self.send_header("Content-Length", length)
                self.end_headers()
                # counted before the body goes out: a client that has it sees the count
                proxy._count(self.command, 0 if head else len(data))
                if not head:
                    self.wfile.write(data)
                conn.close()

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _forward

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _count(self, method: str, body_bytes: int) -> None:
        with self.lock:  # handlers run on the server's threads
            self.requests += 1
            self.gets += method == "GET"
            self.bytes_out += body_bytes

    def counts(self) -> dict[str, int]:
        """``{"bytes_out", "gets", "requests"}`` so far, read together."""
        with self.lock:
            return {"bytes_out": self.bytes_out, "gets": self.gets, "requests": self.requests}

    def reset_counts(self) -> None:
        with self.lock:
            self.bytes_out = self.gets = self.requests = 0

    def close(self) -> None:
        self.server.shutdown()
        self.thread.join()
        self.server.server_close()
