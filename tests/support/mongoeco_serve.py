"""Run a mongoeco MongoDB wire server on 127.0.0.1 until SIGTERM (the tests' private server).

Run by the Python of a virtual environment with ``mongoeco[wire]`` (Python 3.13 or later), not
by the suite's own: ``python mongoeco_serve.py [PORT]``. Port 0 (the default) lets the kernel
choose a free one, so no other process can take it between a probe and the bind. The port the
server listens on is printed on stdout, one line, once it accepts connections.
"""

import asyncio
import signal
import sys

from mongoeco.wire import AsyncMongoEcoProxyServer


async def serve(port: int) -> None:
    server = AsyncMongoEcoProxyServer(host="127.0.0.1", port=port)
    address = await server.start()
    print(address.port, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await server.close()


if __name__ == "__main__":
    asyncio.run(serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
