"""Poll a gateway's /ping every 20 ms from a process of its own, one JSON line per answer.

    python ping_poller.py PORT OUT_FILE STOP_FILE

Run apart from the test, whose event loop is busy with dozens of streams: timing /ping there
would measure the client, not the gateway. Stops when STOP_FILE appears.
"""

from __future__ import annotations

import http.client
import json
import sys
import time
from pathlib import Path


def main(port: int, out: Path, stop: Path) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    connection.request("GET", "/ping")
    connection.getresponse().read()  # connect before measuring
    with out.open("w", encoding="utf-8") as sink:
        while not stop.exists():
            started = time.perf_counter()
            connection.request("GET", "/ping")
            body = connection.getresponse().read()
            elapsed = time.perf_counter() - started
            sink.write(json.dumps({"t": time.time(), "s": elapsed, "ping": json.loads(body)})
                       + "\n")
            sink.flush()
            time.sleep(0.02)


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
