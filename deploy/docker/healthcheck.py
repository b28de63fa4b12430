#!/usr/bin/env python3
"""Container health probe: ``GET https://127.0.0.1:$AKRELAY_PORT/PATH`` must answer 200 (exit 0, else 1).

PATH is ``/healthz`` (the process is up; the image's HEALTHCHECK) or ``/readyz`` (the store is
reachable too; what compose.yaml waits for). The probe talks to its own container over loopback,
so it does not verify the certificate: the node may serve an operator's certificate for a public
name, or a self-signed one, and neither names 127.0.0.1 reliably. No third-party imports, so
that a probe never depends on more than the interpreter.
"""

import os
import ssl
import sys
import urllib.request


def main() -> int:
    path = sys.argv[1] if len(sys.argv) > 1 else "/healthz"
    port = os.environ.get("AKRELAY_PORT", "8443")
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(f"https://127.0.0.1:{port}{path}", context=context, timeout=4) as response:
            return 0 if response.status == 200 else 1
    except Exception as exc:  # noqa: BLE001  (any failure is "unhealthy", said in one line)
        print(f"akrelay-healthcheck {path}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
