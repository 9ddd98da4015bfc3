"""Drives a running Tessera coordinator over HTTPS with Python's own TLS stack.

Usage: python tests/support/tls_client_check.py PORT CA_FILE MODEL
The server's certificate must verify against CA_FILE for "localhost".
Exits non-zero (with the reason) when any check fails. Run by
tests/integration/security/security_test.cc against real daemons.
"""
import contextlib
import http.client
import json
import socket
import ssl
import sys
import urllib.request


@contextlib.contextmanager
def step(name: str):
    """Names the check that failed, with its exception, on stdout."""
    try:
        yield
    except BaseException as e:
        print(f"tls client check failed at {name}: {type(e).__name__}: {e}", flush=True)
        raise


def main() -> int:
    port, ca, model = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    ctx = ssl.create_default_context(cafile=ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    base = f"https://localhost:{port}"

    with step("GET /v1/models"), \
            urllib.request.urlopen(base + "/v1/models", context=ctx, timeout=60) as r:
        models = [m["id"] for m in json.load(r)["data"]]
        assert models == [model], models

    body = json.dumps({"model": model, "prompt": [1, 2, 3], "max_tokens": 5,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(base + "/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with step("POST /v1/completions"), urllib.request.urlopen(req, context=ctx, timeout=60) as r:
        reply = json.load(r)
        assert reply["usage"]["completion_tokens"] == 5, reply

    # A stream over one kept-alive TLS connection, twice.
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=60)
    for i in range(2):
        with step(f"stream {i + 1} of 2 on one connection"):
            conn.request("POST", "/v1/completions",
                         body=json.dumps({"model": model, "prompt": [4, 5], "max_tokens": 4,
                                          "stream": True, "ignore_eos": True}),
                         headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            body = resp.read().decode()
            assert resp.status == 200, (resp.status, body)
            events = [line[6:] for line in body.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]", events
            finishes = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]]
            assert finishes[-1] == "length", events
    conn.close()

    # The version and the cipher are modern.
    with step("TLS version"), \
            ctx.wrap_socket(socket.create_connection(("127.0.0.1", port)),
                            server_hostname="localhost") as s:
        assert s.version() in ("TLSv1.2", "TLSv1.3"), s.version()

    print("tls client checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
