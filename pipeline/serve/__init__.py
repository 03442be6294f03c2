"""Running the bundled `tritonserver` on a rendered model repository (cpu target, any machine).

TritonServer(options)                  context manager: start, wait_until_ready, stop
serve_foreground(options)              until Ctrl-C / SIGTERM
start_detached(options, state_dir)     keeps running; `stop_detached(state_dir)` ends it
                                       (after a crash too: a StopResult says what was left)
"""

from pipeline.serve.command import ServerOptions, server_command
from pipeline.serve.detached import ServerState, StopResult, read_state, start_detached, stop_detached
from pipeline.serve.foreground import serve_foreground
from pipeline.serve.installation import TritonInstallation, find_tritonserver
from pipeline.serve.probe import ModelState
from pipeline.serve.server import TritonServer

__all__ = [
    "ModelState",
    "ServerOptions",
    "ServerState",
    "StopResult",
    "TritonInstallation",
    "TritonServer",
    "find_tritonserver",
    "read_state",
    "serve_foreground",
    "server_command",
    "start_detached",
    "stop_detached",
]
