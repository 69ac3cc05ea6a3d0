"""Concurrent creates through several manager replicas (started by tests/cluster.rs): prints one
line per create, `<status> <sandboxID>`, so the test can check that no sandbox was handed out
twice.

Arguments: the number of creates per manager, then the managers' base URLs. Environment:
E2B_API_KEY.
"""
import concurrent.futures
import os
import sys

import httpx

KEY = os.environ["E2B_API_KEY"]
per = int(sys.argv[1])
urls = sys.argv[2:]


def create(url):
    with httpx.Client(timeout=60) as client:
        r = client.post(f"{url}/sandboxes", headers={"X-API-Key": KEY},
                        json={"templateID": "base", "timeout": 120})
        body = r.json() if r.headers.get("content-type", "").startswith("application/json") else {}
        return r.status_code, body.get("sandboxID", ""), r.text[:200]


jobs = [url for url in urls for _ in range(per)]
with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
    for status, sandbox_id, text in pool.map(create, jobs):
        print(status, sandbox_id or text, flush=True)
