#!/usr/bin/env python3
"""A hotlimit-server JSON API client in Python, standard library only.

As a library: `Client("http://127.0.0.1:8080").check("domain", [{"user": "alice"}])`.
As a script (`python3 python_client.py URL`): the checks tests/json_api.rs runs against a
server on the configuration in that test, exiting non-zero on the first wrong answer.
"""
import json
import sys
import urllib.error
import urllib.request


class Client:
    """check, peek, take and settle over the JSON API."""

    def __init__(self, base):
        self.base = base.rstrip("/")

    def _post(self, path, body):
        req = urllib.request.Request(
            self.base + path,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.load(resp)
        except urllib.error.HTTPError as err:  # 429, 400, 404, 503: a JSON body all the same
            return err.code, json.load(err)

    @staticmethod
    def _request(domain, descriptors, hits):
        return {
            "domain": domain,
            "descriptors": [
                {"entries": [{"key": k, "value": v} for k, v in d.items()]} for d in descriptors
            ],
            "hitsAddend": hits,
        }

    def check(self, domain, descriptors, hits=1):
        return self._post("/v1/check", self._request(domain, descriptors, hits))

    def peek(self, domain, descriptors, hits=1):
        return self._post("/v1/peek", self._request(domain, descriptors, hits))

    def take(self, domain, descriptors, hits=1):
        return self._post("/v1/take", self._request(domain, descriptors, hits))

    def settle(self, ticket, actual):
        return self._post("/v1/settle", {"ticket": ticket, "actual": actual})


def expect(what, got, want):
    if got != want:
        print(f"FAIL {what}: got {got!r}, want {want!r}", file=sys.stderr)
        sys.exit(1)
    print(f"ok   {what}")


def main(base):
    c = Client(base)
    with urllib.request.urlopen(base + "/healthcheck", timeout=10) as resp:
        expect("healthcheck", resp.read().decode(), "OK")

    # 5 a day per user: 5 admitted, then 429 with OVER_LIMIT and the headers.
    codes = [c.check("api", [{"user": "py"}])[0] for _ in range(7)]
    expect("5 admitted then 429", codes, [200] * 5 + [429] * 2)
    status, body = c.check("api", [{"user": "py"}])
    expect("over limit code", (status, body["overallCode"]), (429, "OVER_LIMIT"))
    st = body["statuses"][0]
    expect("current limit", st["currentLimit"], {"requestsPerUnit": 5, "unit": "DAY"})
    expect("nothing left", st["limitRemaining"], 0)
    names = {h["key"] for h in body["responseHeadersToAdd"]}
    expect("draft-10 headers", {"ratelimit", "ratelimit-policy", "retry-after"} <= names, True)

    # check_n: a cost of 3 out of 5, then 2 left; a cost over the limit is over the limit.
    status, body = c.check("api", [{"user": "py-n"}], hits=3)
    expect("check_n 3 of 5", (status, body["statuses"][0]["limitRemaining"]), (200, 2))
    expect("check_n 3 more", c.check("api", [{"user": "py-n"}], hits=3)[0], 429)
    expect("check_n 6 > limit", c.check("api", [{"user": "py-big"}], hits=6)[0], 429)

    # peek counts nothing.
    for _ in range(3):
        status, body = c.peek("api", [{"user": "py-peek"}])
        expect("peek", (status, body["statuses"][0]["limitRemaining"]), (200, 4))

    # take 4 tokens of 10 (GCRA, burst 10), use 1: 3 refunded; take 8, use 10: 2 of debt.
    status, body = c.take("api", [{"model": "m1"}], hits=4)
    expect("take 4", (status, body["statuses"][0]["limitRemaining"]), (200, 6))
    ticket = body["ticket"]
    expect("settle refund", c.settle(ticket, 1), (200, {"settled": True}))
    expect("after refund", c.peek("api", [{"model": "m1"}])[1]["statuses"][0]["limitRemaining"], 8)
    status, body = c.take("api", [{"model": "m1"}], hits=8)
    expect("take 8", (status, body["statuses"][0]["limitRemaining"]), (200, 1))
    expect("settle debt", c.settle(body["ticket"], 10)[0], 200)
    expect("debt: over the limit", c.check("api", [{"model": "m1"}])[0], 429)
    # A ticket settles once; an unknown one is a 404 with a reason.
    status, body = c.settle(ticket, 1)
    expect("settled twice", (status, "error" in body), (404, True))

    # Bad input: a typed 400, nothing counted.
    status, body = c._post("/v1/check", {"domain": "", "descriptors": []})
    expect("empty domain", (status, "error" in body), (400, True))
    status, body = c._post("/v1/check", {"domian": "api"})
    expect("unknown field", status, 400)

    # An unknown domain or descriptor: OK, no limit.
    status, body = c.check("nope", [{"user": "x"}])
    expect("unknown domain", (status, body["statuses"][0]), (200, {"code": "OK", "limitRemaining": 0}))

    # envoyproxy/ratelimit's /json endpoint, as its clients call it.
    status, body = c._post("/json", {"domain": "api", "descriptors": [{"entries": [{"key": "user", "value": "py-json"}]}]})
    expect("/json", (status, body["overallCode"], body["statuses"][0]["limitRemaining"]), (200, "OK", 4))


if __name__ == "__main__":
    main(sys.argv[1])
