"""torch's own LocalElasticAgent tests, run against elastic-training's rendezvous backend.

torch's test/distributed/elastic/agent/server/test/local_elastic_agent_test.py (from the torch source: CI takes it
from Debian's source package, hack/torch-tests.sh) drives a real LocalElasticAgent, whose workers are real processes,
through whatever rendezvous handler torch's registry returns for its RendezvousParameters. This runner changes only
where those parameters point:

* the backend is "elastic-training", found through the torchrun.handlers entry point on PYTHONPATH, as in a pod;
* the endpoint is the c10d store of an `rdzv-sidecar serve` started for each test (one run per test, as torch's
  tests use a fresh run id each) as the chart's dedicated pod runs it (no member itself, files dir set: it follows
  the membership), and torch's class-wide etcd server (for its etcd backends) is not started;
* each agent is a node: it takes a loopback address of its own (127.0.0.N, its --local-addr) and registers it with
  an `rdzv-sidecar join` of its own, as each pod's sidecar registers its pod. The join dies with its agent
  (PR_SET_PDEATHSIG: the pod goes), and an agent that starts after one was killed takes the address that was freed
  once that join has left (the container restarts in the same pod): the address is an flock that the join inherits.

Each of torch's scenarios runs once (its c10d variant where it has one). Environment: ET_TORCH_AGENT_TEST (torch's
file), ET_SIDECAR (the rdzv-sidecar binary), ET_WORK (a scratch directory). Standard library and torch only.
"""

import ctypes
import fcntl
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

UPSTREAM = os.environ["ET_TORCH_AGENT_TEST"]
SIDECAR = os.environ["ET_SIDECAR"]
BACKEND = "elastic-training"
NODES = 8  # loopback addresses a test may take: torch's largest job has 7 agents


def _common_utils():
    """What torch's file takes from torch.testing._internal.common_utils: sanitizer flags (false: no sanitizer here)
    and a skip decorator. The real module imports torch.utils.cpp_extension, which needs setuptools, which the trainer
    images do not carry."""
    import types

    m = types.ModuleType("torch.testing._internal.common_utils")
    m.TEST_WITH_DEV_DBG_ASAN = m.TEST_WITH_TSAN = False
    m.skip_but_pass_in_sandcastle_if = lambda cond, reason: unittest.skipIf(cond, reason)
    return m


sys.modules.setdefault("torch.testing._internal.common_utils", _common_utils())
sys.path.insert(0, os.path.dirname(UPSTREAM))
upstream = __import__(os.path.splitext(os.path.basename(UPSTREAM))[0])

import torch.distributed.elastic.rendezvous.registry as registry  # noqa: E402

# Children this process started (its joins, the test's serve): stopped when its test ends.
_children = []


_given = set()  # the ports this process handed out: the kernel may offer one it just freed again


def _free_port():
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _given:
            _given.add(port)
            return port
    raise RuntimeError("every port the kernel offered in 100 tries was handed out before")


def _die_with_parent():
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class _Exited(RuntimeError):
    """A sidecar that exited before it was ready; output is what it printed (the test's directory goes with it)."""

    def __init__(self, message, output):
        super().__init__(f"{message}:\n{output}")
        self.output = output


def _wait_ready(proc, health, log, what, offset):
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            with open(log, "rb") as f:
                f.seek(offset)
                raise _Exited(f"{what} exited with {proc.returncode}", f.read()[-4000:].decode(errors="replace"))
        try:
            with urllib.request.urlopen(f"http://{health}/readyz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready in 60 s: see {log}")


def _start(make_args, log, what, **kw):
    """A sidecar with the arguments make_args() returns, ready. A free port is free only until someone binds it: another
    process (the other torch's suite runs beside this one), or this one, whose next pick the kernel may hand out again.
    A sidecar that finds its port taken is started again with fresh ones (serve failed so in CI)."""
    for attempt in range(5):
        health = f"127.0.0.1:{_free_port()}"
        offset = os.path.getsize(log) if os.path.exists(log) else 0
        with open(log, "ab") as out:
            proc = subprocess.Popen([SIDECAR, *make_args(), f"--health-addr={health}"], stdout=out,
                                    stderr=subprocess.STDOUT, preexec_fn=_die_with_parent, **kw)
        _children.append(proc)
        try:
            _wait_ready(proc, health, log, what, offset)
            return proc
        except _Exited as e:
            if "address already in use" not in e.output or attempt == 4:
                raise
            print(f"{what}: a port was taken ({attempt + 1}); starting it again with others", file=sys.stderr, flush=True)


def _take_node():
    """The first free node of this test: (index, the locked fd)."""
    nodes = os.environ["ET_NODES_DIR"]
    for i in range(NODES):
        fd = os.open(os.path.join(nodes, str(i)), os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return i, fd
        except BlockingIOError:
            os.close(fd)
    raise RuntimeError(f"all {NODES} nodes are taken")


_upstream_handler = registry.get_rendezvous_handler


def get_rendezvous_handler(params):
    """torch's registry, once this agent is a node: its own address, registered by a join of its own."""
    if params.backend == BACKEND and not params.local_addr:
        i, fd = _take_node()
        host = f"127.0.0.{i + 1}"
        _start(lambda: ["join", f"--endpoints={os.environ['ET_SERVE_URL']}", f"--member-host={host}", "--member-slots=1",
                        f"--member-index={i}", "--lease-ttl=2s"],
               os.path.join(os.environ["ET_NODES_DIR"], f"join-{i}.log"), f"join {host}", pass_fds=(fd,))
        params.local_addr = host
    return _upstream_handler(params)


registry.get_rendezvous_handler = get_rendezvous_handler


def _has_tensorpipe():
    import torch

    return hasattr(getattr(torch._C, "_distributed_rpc", None), "TensorPipeAgent")


class _Scenario(Exception):
    """What a test of torch's would run (probe)."""

    def __init__(self, backend, fn):
        super().__init__(backend)
        self.backend, self.fn = backend, fn


class _Probe(upstream.LocalElasticAgentTest):
    def run_test_with_backend(self, backend, test_to_run):
        raise _Scenario(backend, test_to_run)


def scenarios():
    """One of torch's tests per scenario (the function it runs), the c10d variant where there is one."""
    chosen = {}
    for name in unittest.TestLoader().getTestCaseNames(upstream.LocalElasticAgentTest):
        try:
            getattr(_Probe(name), name)()
        except _Scenario as s:
            key = getattr(s.fn, "__name__", name)
            key = name if key == "<lambda>" else key
            if key not in chosen or s.backend == "c10d":
                chosen[key] = name
        except unittest.SkipTest:
            pass
    return sorted(chosen.values())


class ElasticTrainingBackendAgentTest(upstream.LocalElasticAgentTest):
    """torch's tests, each on a serving sidecar of its own through the elastic-training backend."""

    @classmethod
    def setUpClass(cls):
        pass  # torch's etcd server is for its etcd backends

    @classmethod
    def tearDownClass(cls):
        pass

    def run_test_with_backend(self, backend, test_to_run):
        work = tempfile.mkdtemp(prefix=self._testMethodName + "-", dir=os.environ["ET_WORK"])
        nodes = os.path.join(work, "nodes")
        os.mkdir(nodes)
        ports = {}

        def serve_args():  # each try on an empty data dir: one that failed may have begun its own
            ports.update(client=_free_port(), c10d=_free_port(), peer=_free_port(), tries=ports.get("tries", 0) + 1)
            url = f"http://127.0.0.1:{ports['client']}"
            return ["serve", f"--data-dir={work}/data-{ports['tries']}", f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
                    f"--listen-peer-urls=http://127.0.0.1:{ports['peer']}", f"--c10d-addr=127.0.0.1:{ports['c10d']}",
                    f"--files-dir={work}/files", "--unsafe-no-fsync", "--register=false"]

        _start(serve_args, os.path.join(work, "serve.log"), "serve")
        url, c10d = f"http://127.0.0.1:{ports['client']}", ports["c10d"]
        # The agents this test spawns take their nodes and the serving sidecar from the environment.
        os.environ.update(ET_SERVE_URL=url, ET_NODES_DIR=nodes)
        self._backend, self._endpoint = BACKEND, f"127.0.0.1:{c10d}"
        if test_to_run.__name__ == "torch_rpc" and not _has_tensorpipe():
            self.skipTest("this torch is built without TensorPipe (Debian's 2.14): torch.distributed.rpc cannot start, "
                          "on torch's own c10d backend alike")
        print(f"{self._testMethodName}: torch's {test_to_run.__name__} (written for {backend}) on {BACKEND}, "
              f"logs in {work}", file=sys.stderr, flush=True)
        test_to_run()

    def tearDown(self):
        while _children:
            p = _children.pop()
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        super().tearDown()


def load_tests(loader, tests, pattern):
    names = sys.argv[1:] or scenarios()
    return unittest.TestSuite(ElasticTrainingBackendAgentTest(n) for n in names)


if __name__ == "__main__":
    # torch's file starts its agents with multiprocessing's default context and passes them the test case, which
    # only fork does not pickle: the default until Python 3.14 (forkserver since).
    import multiprocessing

    multiprocessing.set_start_method("fork")
    unittest.main(argv=sys.argv[:1], verbosity=2)
