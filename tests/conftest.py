"""Shared pytest setup.

- Tests marked ``gpu`` are skipped (never faked) where no CUDA device is present.
- Tests marked ``compile`` build every kernel for sm_80, sm_89 and sm_90a with NVRTC and read
  their ptxas reports and SASS (every test that uses the ``kernel_cache`` fixture is marked here);
  tests marked ``slow`` are the long property-based runs. The default run (``pyproject.toml``'s
  ``-m "not slow and not compile"``) leaves both out; ``-m "slow or compile"`` runs them, and a
  later ``-m`` replaces the default one.
- The tests import the installed ``cudattn`` (the header line names the one under test).
- Temporary files: a run that passes leaves none (``_temporary_files_removed``).
- Random inputs: each test's seed counters start from its own id (``_seeds_of_this_test``), so a
  test draws the same inputs whatever ran before it, in one process or split among workers (-n).
- Host memory: the run's peak resident set size is printed at the end; with
  ``CUDATTN_TEST_MAX_RSS_MIB`` set (CI sets it), a larger peak fails the run, so no test can
  quietly build a multi-GiB host array.
"""

from __future__ import annotations

import functools
import itertools
import os
import resource
import shutil
import sys
import zlib

import pytest


#: The compile targets the CPU tests build every kernel for.
COMPILE_ARCHS = ("sm_80", "sm_89", "sm_90a")


@pytest.fixture(scope="session")
def kernel_cache(tmp_path_factory):
    """The kernel cache for the compile tests: the user's own (``$CUDATTN_CACHE_DIR``, else
    ``~/.cache/cudattn``), the one the demo and ``python -m cudattn cache warm`` fill, so a second
    run compiles nothing. It is first filled by the parallel warm-up for COMPILE_ARCHS, so that the
    builds use every CPU; the tests then read each kernel's cubin, ptxas report and SASS from it. A
    kernel that failed to build is not in it, and the test that asks for it compiles it again and
    reports the error. Where the user's cache is not usable (read-only, refused for safety), a
    temporary one is used and removed with the run's other temporary files."""
    import nvrtc_cache
    from cudattn._tools import warm as _warm

    cache = nvrtc_cache.default_cache()
    if not cache.info()["writable"]:
        cache = nvrtc_cache.Cache(tmp_path_factory.mktemp("kernels"))
    _warm.warm(COMPILE_ARCHS, cache=cache, progress=False)
    return cache


_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(autouse=True)
def _seeds_of_this_test(request):
    """Restart every module-level ``_seed`` counter (``itertools.count``) of the test modules and
    their shared case modules at a number made from the test's id: drawn from a counter shared by
    the whole run, a test's inputs depended on how many draws the tests before it in its process
    made, so a failure on one input moved with the order and the split among workers, and looked
    like a race. The id's CRC-32 keeps the seeds of different tests apart."""
    base = zlib.crc32(request.node.nodeid.encode())
    for mod in list(sys.modules.values()):
        path = getattr(mod, "__file__", None) or ""
        if path.startswith(_TESTS_DIR) and isinstance(getattr(mod, "_seed", None), itertools.count):
            mod._seed = itertools.count(base)


@pytest.fixture(scope="session", autouse=True)
def _temporary_files_removed(tmp_path_factory, request):
    """A run whose tests all passed leaves nothing in the temporary directory: its base directory
    (``pytest-of-<user>/pytest-N``, the compile tests' exports among it) is removed, with the
    ``pytest-current`` link to it and ``pytest-of-<user>`` itself when nothing else is in it. A run
    with failures keeps its failing tests' files to look at (``tmp_path_retention_policy``)."""
    yield
    if request.session.testsfailed:
        return
    base = tmp_path_factory.getbasetemp()
    shutil.rmtree(base, ignore_errors=True)
    parent = base.parent
    for link in parent.glob("*-current"):
        if link.is_symlink() and os.path.realpath(link) == os.path.realpath(base):
            link.unlink()
    if parent.name.startswith("pytest-of-"):
        try:
            parent.rmdir()  # only when empty: another run's directories stay
        except OSError:
            pass


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU (skipped, never faked, where none is present)")
    config.addinivalue_line("markers", "slow: a long property-based run (left out by default; -m slow runs it)")
    config.addinivalue_line("markers", "solo: needs the GPU to itself (fills its memory, or reads device-wide "
                                       "figures); skipped in parallel (-n) runs, which share the GPU among workers")
    config.addinivalue_line("markers", "compile: builds every kernel of three archs with NVRTC (left out by default; "
                                       "-m compile runs it)")
    # Parallel runs (pytest-xdist, -n): one BLAS thread a worker. The float64 references multiply
    # with NumPy's BLAS, which starts a thread a core in every process: with 14 workers on 16
    # cores a test of 1.3 s alone took over 150 s (4 workers: 50 s; one BLAS thread: 1 s). The
    # workers start after this hook and inherit the environment; a value the user set is kept.
    if getattr(config.option, "numprocesses", None):
        for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(var, "1")


def pytest_report_header(config):
    import cudattn

    return f"cudattn {cudattn.__version__} from {os.path.dirname(cudattn.__file__)}"


@functools.lru_cache(maxsize=None)
def gpu_available() -> bool:
    """True when the CUDA driver initialises and sees at least one device (checked once)."""
    try:
        from cuda.bindings import driver

        (err,) = driver.cuInit(0)
        if err != 0:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == 0 and count > 0
    except Exception:  # no driver library, no cuda-bindings, ...
        return False


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config, items):
    for item in items:
        if "kernel_cache" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.compile)
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the other workers' memory would count as this test's
        solo = pytest.mark.skip(reason="needs the GPU to itself: run it without -n")
        for item in items:
            if item.get_closest_marker("solo") is not None:
                item.add_marker(solo)
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_items and not gpu_available():
        skip = pytest.mark.skip(reason="no CUDA device available")
        for item in gpu_items:
            item.add_marker(skip)


def _peak_rss_mib() -> float:
    """Peak resident set size of this process and of its waited-for children, in MiB (Linux: KiB units)."""
    scale = 1 / 2**20 if sys.platform == "darwin" else 1 / 1024
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) * scale


_peak_seen = {"mib": 0.0, "test": "(collection)"}


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Remember which test first pushed the peak to its final value (named in the summary)."""
    yield
    peak = _peak_rss_mib()
    if peak > _peak_seen["mib"] + 1:
        _peak_seen.update(mib=peak, test=item.nodeid)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    peak = _peak_rss_mib()
    limit = os.environ.get("CUDATTN_TEST_MAX_RSS_MIB")
    line = f"peak host memory (RSS) of the test process or a child it waited for: {peak:.0f} MiB, " \
           f"reached in {_peak_seen['test']}"
    if limit:
        line += f" (limit {float(limit):.0f} MiB)"
    terminalreporter.write_line(line)


def pytest_sessionfinish(session, exitstatus):
    limit = os.environ.get("CUDATTN_TEST_MAX_RSS_MIB")
    if limit and _peak_rss_mib() > float(limit) and session.exitstatus == 0:
        session.exitstatus = 1
        sys.stderr.write(f"FAILED: peak host memory {_peak_rss_mib():.0f} MiB exceeds "
                         f"CUDATTN_TEST_MAX_RSS_MIB={limit}\n")


@pytest.fixture
def torch():
    """torch with CUDA, for tests that use it as a peer or a producer of operands (skipped without)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch without CUDA")
    return torch


@pytest.fixture(params=["fastest", "portable", "usual-tiles"])
def kernel_family(request, monkeypatch):
    """Run on the kernel family the device would pick (Hopper: the sm90 one) and, on Hopper, once
    more on the portable sm80 family, which sm_80/sm_89 devices run, and once more on the Hopper
    builds that larger problems run ("usual-tiles": test shapes are mostly small enough for the
    small-grid builds, `_traits.small_grid_rows`). A GPU module opts in for all its tests with
    ``pytest.mark.usefixtures("kernel_family")``."""
    from cudattn._calls import call as _call
    from cudattn._kernels import plan as _plan
    from cudattn._runtime import device as _device
    from cudattn._kernels import traits as _traits

    if request.param != "fastest" and _device.device_properties(0).arch not in _traits.HOPPER_ARCHS:
        pytest.skip(f"{request.param}: the same kernels as 'fastest' on this device")
    if request.param == "portable":
        monkeypatch.setattr(_traits, "FORCED_FAMILY", "sm80")
    elif request.param == "usual-tiles":
        monkeypatch.setattr(_traits, "small_grid_rows", lambda *a: None)
        monkeypatch.setattr(_plan, "_plans", {})  # plans and recorded calls made with the rule on
        monkeypatch.setattr(_call, "_plans", {})
    return request.param
