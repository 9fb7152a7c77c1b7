#!/usr/bin/env python3
"""A fenced counter: the kind of resource that makes a lease-based lock safe.

POST /increment?token=N&writer=W  adds one to the counter unless N is lower than the highest
token seen (409 then: the writer's lock was taken over while it was paused or slow).
GET /                              {"value", "accepted", "rejected", "highest"}
Every accepted write is logged with its token and time to the file given as second argument.

    python3 examples/fenced_store.py PORT [LOG]

It listens on 127.0.0.1, or on the address in $FENCED_STORE_HOST (the demo on a real node
serves its pods on the pod bridge's address).
"""
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

state = {"value": 0, "accepted": 0, "rejected": 0, "highest": 0}
lock = threading.Lock()
log = open(sys.argv[2], "a") if len(sys.argv) > 2 else None


class Store(BaseHTTPRequestHandler):
    def reply(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        with lock:
            self.reply(200, dict(state))

    def do_POST(self):
        query = parse_qs(urlparse(self.path).query)
        try:
            token = int(query["token"][0])
        except (KeyError, ValueError):
            return self.reply(400, {"error": "invalid_request", "message": "token=N is required"})
        writer = query.get("writer", ["?"])[0]
        with lock:
            if token < state["highest"]:
                state["rejected"] += 1
                return self.reply(409, {"error": "stale_token", "message": f"{token} < {state['highest']}"})
            state["highest"] = token
            state["value"] += 1
            state["accepted"] += 1
            if log:
                log.write(f"{time.time():.6f} {token} {writer} {state['value']}\n")
                log.flush()
            self.reply(200, dict(state))

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    host = os.environ.get("FENCED_STORE_HOST", "127.0.0.1")
    ThreadingHTTPServer((host, int(sys.argv[1])), Store).serve_forever()
