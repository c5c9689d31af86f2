"""A webhook receiver for the webhook and cron tests: it verifies every request with the official
Standard Webhooks library (`standardwebhooks`, pinned in scripts/python-requirements.txt) and
answers as told.

    python tests/webhooks/receiver.py --secret whsec_... [--port N] [--answers 500,200]

It prints `READY http://127.0.0.1:PORT`, then one JSON line per request it received:
`{"id", "timestamp", "verified", "error", "bodySha256", "type", "runId", "status", "answered"}`
(`verified`: the library accepted the signature, `bodySha256`: the body's hash, `type`/`runId`/
`status`: the body's event and its run's id and status, `answered`: the HTTP status it answered
with). `--answers` is the sequence of statuses
answered to the attempts of one `webhook-id` (the last one repeats): `500,200` fails the first
attempt of every delivery and accepts the second; `410` answers Gone. A request whose signature
does not verify is answered 400 whatever the sequence says.
"""

import argparse
import hashlib
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--secret", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--answers", default="200")
    args = parser.parse_args()
    webhook = Webhook(args.secret)
    answers = [int(a) for a in args.answers.split(",")]
    seen: dict = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the library's name)
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {k: v for k, v in self.headers.items()}
            record = {
                "id": headers.get("webhook-id"),
                "timestamp": headers.get("webhook-timestamp"),
                "verified": False,
                "error": None,
                "bodySha256": hashlib.sha256(body).hexdigest(),
            }
            try:
                payload = webhook.verify(body, headers)
                record["verified"] = True
                data = payload.get("data") or {}
                record.update(
                    type=payload.get("type"),
                    runId=data.get("runId"),
                    status=data.get("status"),
                    cronId=data.get("cronId"),
                    idempotencyKey=data.get("idempotencyKey"),
                    suspension=data.get("suspension") is not None,
                )
            except (WebhookVerificationError, ValueError) as e:
                record["error"] = str(e)
            with lock:
                n = seen.get(record["id"], 0)
                seen[record["id"]] = n + 1
            status = answers[min(n, len(answers) - 1)] if record["verified"] else 400
            record["answered"] = status
            self.send_response(status)
            self.send_header("content-length", "0")
            self.end_headers()
            with lock:
                print(json.dumps(record), flush=True)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"READY http://127.0.0.1:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    sys.exit(0)


if __name__ == "__main__":
    main()
