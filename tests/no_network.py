"""Run one of nlq's scripts with the network cut, as on a machine without one (for the tests):

    python tests/no_network.py prepare_data.py shakespeare --data_dir /tmp/d

Every name lookup and socket connection raises OSError, and tiktoken's file readers (its download path)
raise too, so a script that tries to download anything fails instead of quietly using the network.
"""
import runpy
import socket
import sys
from pathlib import Path

import tiktoken.load


def _cut(*args, **kwargs):
    raise OSError(f"network cut by tests/no_network.py (attempted: {args[:1]})")


socket.getaddrinfo = socket.create_connection = socket.socket.connect = _cut
tiktoken.load.read_file = tiktoken.load.read_file_cached = _cut

if __name__ == "__main__":
    script = Path(__file__).resolve().parents[1] / sys.argv[1]
    sys.argv = [str(script), *sys.argv[2:]]
    sys.path.insert(0, str(script.parent))  # as `python script.py` would: import the repository's modules
    runpy.run_path(str(script), run_name="__main__")
