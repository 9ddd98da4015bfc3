"""Sends bodies over the coordinator's server.max_body_bytes with Python's own
HTTP clients, which send the whole body before they read a response, and
checks that each gets the 413 (not a broken pipe or a reset).

Usage: python tests/support/body_limit_client_check.py PORT LIMIT_BYTES
Exits non-zero (with the reason) when any check fails. Run by
tests/integration/security/security_http_test.cc against a real coordinator.
"""
import http.client
import json
import sys
import urllib.error
import urllib.request


def expect_413(what, status, body):
    assert status == 413, f"{what}: status {status}: {body[:200]!r}"
    error = json.loads(body)["error"]
    assert error["code"] == "request_too_large", f"{what}: {error}"
    print(f"{what}: 413 {error['message']}")


def main() -> int:
    port, limit = int(sys.argv[1]), int(sys.argv[2])
    url = f"http://127.0.0.1:{port}/v1/completions"
    # Far beyond what the kernel buffers on loopback, so a server that stops
    # reading early resets the connection while the client still sends.
    body = json.dumps({"model": "m", "prompt": "x" * (8 * limit)}).encode()

    # urllib: Content-Length, the body sent in one go.
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            raise AssertionError(f"urllib: answered {r.status}, not 413")
    except urllib.error.HTTPError as e:
        expect_413("urllib (Content-Length)", e.code, e.read())

    # http.client, chunked: the limit is found while reading the body.
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    step = 1 << 20
    conn.request("POST", "/v1/completions",
                 body=(body[i:i + step] for i in range(0, len(body), step)),
                 headers={"Content-Type": "application/json"}, encode_chunked=True)
    r = conn.getresponse()
    expect_413("http.client (chunked)", r.status, r.read())
    assert r.getheader("Connection") == "close", r.getheaders()
    conn.close()

    # The server goes on: a small request on a new connection is answered.
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=60) as r:
        assert r.status == 200, r.status
    print("body limit client checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
