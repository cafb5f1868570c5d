"""llama.cpp's OpenAI-compatible HTTP server, run in-process by the xllamacpp wheel.

Started (in the background, in setup.sh's venv) by bench/realmodel/setup.sh, which
passes everything through the environment; not meant to be run by hand. It prints
REALMODEL_READY once listening and stops on SIGTERM or SIGINT.
"""

import os
import signal
import threading

import xllamacpp as xlc

port = int(os.environ["REALMODEL_PORT"])
alias = os.environ["REALMODEL_NAME"]
ctx = int(os.environ.get("REALMODEL_CTX", "8192"))
parallel = int(os.environ.get("REALMODEL_PARALLEL", "2"))
threads = int(os.environ.get("REALMODEL_THREADS", "0")) or (os.cpu_count() or 2)

params = xlc.CommonParams()
params.model.path = os.environ["REALMODEL_GGUF"]
params.model_alias = alias        # the name clients put in "model"
params.hostname = "127.0.0.1"     # never reachable from outside the machine
params.port = port
params.use_jinja = True           # the GGUF's own chat template, tool section included
params.n_parallel = parallel
params.n_ctx = ctx * parallel     # llama.cpp splits the context evenly across the slots
params.cpuparams.n_threads = threads
params.cpuparams_batch.n_threads = threads
if hasattr(params, "webui"):
    params.webui = False

server = xlc.Server(params)       # loads the model and starts listening
print(f"REALMODEL_READY {server.listening_address} model={alias}", flush=True)
stop = threading.Event()
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda *_: stop.set())
while not stop.wait(1.0):
    pass
# The server's threads do not join: skip the interpreter's teardown, which would hang.
os._exit(0)
