"""The C build as docs/C_API.md writes it, with no GPU and no driver: `export --print-cflags` gives
the -I options, the example compiles (C11 and C++) and links with -ldl -lm (no -lcuda), and run
where libcuda cannot be loaded, or only a stand-in of it, it stops with exit status 3 and says why.
The stand-in libcuda.so.1 exports exactly the names cudattn.h asks dlsym for, so every name it
asks for is one that cuda.h maps the function to (cuMemAlloc -> cuMemAlloc_v2)."""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cudattn import __version__
from cudattn._kernels import registry as _kernels
from cudattn._tools import cabi as _cabi
from cudattn._tools import cbuild as _cbuild
from cudattn._tools import cli as _cli
from cudattn._tools import export as _export

REPO = Path(__file__).resolve().parents[1]
HEADER = _kernels.source_root().joinpath("export", "cudattn.h").read_text(encoding="utf-8")
HEADERS = {name: _kernels.source_root().joinpath("export", name).read_text(encoding="utf-8") for name in _export.HEADERS}
EXAMPLE = _kernels.source_root().joinpath("export", "attention.c").read_text(encoding="utf-8")
EXIT_NO_GPU = 3

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


def _driver_functions() -> list[str]:
    body = re.search(r"#define CUDATTN_DRIVER_FUNCTIONS\(X\)(.*?)\n\n", HEADER, re.S).group(1)
    return re.findall(r"X\((cu\w+)\)", body)


def _real_libcuda() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def test_every_driver_function_called_is_loaded_and_redirected():
    listed = _driver_functions()
    assert len(listed) == len(set(listed)) >= 25
    called = set(re.findall(r"\b(cu[A-Z]\w*)\s*\(", "".join(HEADERS.values()) + EXAMPLE))
    assert called <= set(listed), sorted(called - set(listed))
    redirected = re.findall(r"#undef (cu\w+)\n#define \1 \(cudattn__cu_fn\([01]\)->p_\1\)", HEADER)
    assert redirected == listed
    soft = re.findall(r"#define (cu\w+) \(cudattn__cu_fn\(0\)", HEADER)
    assert soft == ["cuInit", "cuGetErrorName", "cuGetErrorString"]  # the ones with a no-driver stand-in


def _fake_export(out: Path) -> Path:
    """An export directory's headers and example (one made-up kernel row): enough to compile."""
    manifest = {"cudattn": __version__, "format": _export.FORMAT, "id": "0" * 32, "archs": {"sm_80": {
        "kernels": [{"file": "a.cubin", "kind": "append", "select": {"defines": {}}, "entries": ["kv_cache_append"],
                     "threads": 128, "dynamic_smem": 0}],
        "selection": [{"kind": "append", "file": "a.cubin"}]}}}
    (out / "include").mkdir(parents=True)
    (out / "examples").mkdir()
    (out / "include" / "cudattn_params.h").write_text(_cabi.header(__version__, _export.FORMAT))
    (out / "include" / "cudattn_kernels.h").write_text(_cbuild.kernel_table_header(manifest))
    for name, text in HEADERS.items():
        (out / "include" / name).write_text(text)
    (out / "examples" / "attention.c").write_text(EXAMPLE)
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(export dir, flags, the example linked without libcuda)."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    out = _fake_export(tmp_path_factory.mktemp("c") / "export")
    res = subprocess.run([sys.executable, "-m", "cudattn", "export", "--print-cflags", "--out", str(out)],
                         capture_output=True, text=True, timeout=120)
    if res.returncode == 1 and "no cuda.h" in res.stderr:
        pytest.skip("no cuda.h: the nvidia-cuda-runtime wheel is not installed")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert len(lines) == 1 and res.stderr == ""  # captured, as by $(...): the flags alone
    flags = lines[0].split()
    assert flags[0] == f"-I{out.resolve() / 'include'}" and os.path.isfile(flags[1][2:] + "/cuda.h")
    exe = out.parent / "attention"
    res = subprocess.run(["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", *flags,
                          str(out / "examples" / "attention.c"), "-ldl", "-lm", "-o", str(exe)],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return out, flags, exe


def test_print_cflags_needs_no_out_and_compiles_nothing():
    res = subprocess.run([sys.executable, "-m", "cudattn", "export", "--print-cflags"], capture_output=True,
                         text=True, timeout=120)
    if res.returncode == 1 and "no cuda.h" in res.stderr:
        pytest.skip("no cuda.h")
    assert res.returncode == 0, res.stderr
    (flag,) = res.stdout.split()
    assert flag.startswith("-I") and os.path.isfile(os.path.join(flag[2:], "cuda.h")) and res.stderr == ""


def test_print_cflags_on_a_terminal_adds_a_compile_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    if _cbuild.cuda_include() is None:
        pytest.skip("no cuda.h")
    assert _cli.main(["export", "--print-cflags", "--out", str(tmp_path / "x")]) == 0
    out, err = capsys.readouterr()
    assert err == (f"compile and link the example: cc -std=c11 -O2 {out.strip()} "
                   f"{tmp_path / 'x' / 'examples' / 'attention.c'} -ldl -lm -o attention\n")
    assert not (tmp_path / "x").exists()  # nothing written


def test_the_example_compiles_as_cpp_and_with_the_driver_linked(built):
    out, flags, _ = built
    if shutil.which("c++"):
        res = subprocess.run(["c++", "-std=c++11", "-Wall", "-Wextra", "-Werror", "-x", "c++", "-fsyntax-only",
                              *flags, str(out / "examples" / "attention.c")], capture_output=True, text=True)
        assert res.returncode == 0, res.stderr
    res = subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-fsyntax-only", "-DCUDATTN_LINK_CUDA",
                          *flags, str(out / "examples" / "attention.c")], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def _symbols(flags) -> list[str]:
    """The names cuda.h maps each driver function of the list to, as the header's dlsym asks."""
    text = "#include <cuda.h>\n#define S(x) #x\n#define XS(x) S(x)\n" + "".join(
        f"XS({f})\n" for f in _driver_functions())
    res = subprocess.run(["cc", "-E", "-P", *flags, "-"], input=text, capture_output=True, text=True, check=True)
    return re.findall(r'^"(\w+)"$', res.stdout, re.M)


def _stand_in(tmp_path: Path, flags, leave_out: str | None = None) -> Path:
    """A libcuda.so.1 that exports the names asked for: cuInit works and no device is seen."""
    names = _symbols(flags)
    assert len(names) == len(_driver_functions()) and "cuMemAlloc_v2" in names
    body = "".join(
        "int cuInit(unsigned f) { (void)f; return 0; }\n" if n == "cuInit" else
        "int cuDeviceGetCount(int* n) { *n = 0; return 0; }\n" if n == "cuDeviceGetCount" else
        f"int {n}(void) {{ return 999; }}\n" for n in names if n != leave_out)
    lib = tmp_path / ("lib-" + (leave_out or "all"))
    lib.mkdir()
    (lib / "fake.c").write_text(body)
    subprocess.run(["cc", "-shared", "-fPIC", str(lib / "fake.c"), "-o", str(lib / "libcuda.so.1")], check=True)
    return lib


def _run(exe, out, lib=None):
    env = dict(os.environ)
    if lib is not None:
        env["LD_LIBRARY_PATH"] = f"{lib}:{env.get('LD_LIBRARY_PATH', '')}"
    return subprocess.run([str(exe), str(out)], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_LIBRARY_PATH stand-in: Linux")
def test_every_name_the_header_loads_resolves_and_no_device_is_status_3(built, tmp_path):
    out, flags, exe = built
    res = _run(exe, out, _stand_in(tmp_path, flags))
    assert res.returncode == EXIT_NO_GPU, res
    assert res.stderr.strip() == "no CUDA device: the NVIDIA driver sees no GPU" and res.stdout == ""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_LIBRARY_PATH stand-in: Linux")
def test_a_driver_without_a_function_is_named(built, tmp_path):
    out, flags, exe = built
    res = _run(exe, out, _stand_in(tmp_path, flags, leave_out="cuTensorMapEncodeTiled"))
    assert res.returncode == EXIT_NO_GPU, res
    assert "the CUDA driver is too old: libcuda.so.1 has no cuTensorMapEncodeTiled" in res.stderr


@pytest.mark.skipif(_real_libcuda(), reason="a CUDA driver is installed here")
def test_no_driver_is_status_3_with_where_libcuda_comes_from(built, tmp_path):
    out, flags, exe = built
    res = _run(exe, out)
    assert res.returncode == EXIT_NO_GPU, res
    (line,) = res.stderr.splitlines()
    assert line.startswith("no CUDA driver: libcuda.so.1 could not be loaded") and "NVIDIA driver" in line
    # a program that skips cudattn_load_driver: cuInit fails as with no GPU, with the reason as its
    # error string; another driver call stops the program with that reason
    src = tmp_path / "use.c"
    src.write_text('#include "cudattn.h"\nint main(void) { const char* s = 0; CUdeviceptr p; CUresult r = cuInit(0);\n'
                   '  cuGetErrorString(r, &s); printf("%d %s\\n", (int)r, s); fflush(stdout);\n  return (int)cuMemAlloc(&p, 16); }\n')
    subprocess.run(["cc", "-std=c11", *flags, str(src), "-ldl", "-o", str(tmp_path / "use")], check=True)
    res = subprocess.run([str(tmp_path / "use")], capture_output=True, text=True, timeout=60)
    assert res.stdout.startswith("100 no CUDA driver: libcuda.so.1 could not be loaded"), res.stdout
    assert res.returncode < 0 and "a CUDA driver function was called, but no CUDA driver" in res.stderr


@pytest.mark.compile
@needs_cc
def test_ci_script_exports_builds_links_and_runs(tmp_path):
    """.ci/c_example.sh, from another directory, against this interpreter's cudattn."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
               TMPDIR=str(tmp_path))
    res = subprocess.run(["bash", str(REPO / ".ci" / "c_example.sh")], cwd=tmp_path, capture_output=True,
                         text=True, env=env, timeout=1800)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "c_example: " in res.stdout
    assert list(tmp_path.iterdir()) == []  # its temp dir is gone


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="LD_LIBRARY_PATH stand-in: Linux")
def test_the_program_of_the_docs_builds_as_written_and_runs_to_its_check(built, tmp_path):
    out, flags, _ = built
    doc = (REPO / "docs" / "C_API.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```c\n(.*?)```", doc, re.S)
    (src,) = [b for b in blocks if "int main" in b]
    for i, fragment in enumerate(b for b in blocks if "int main" not in b):  # functions of a program: they compile
        (tmp_path / f"fragment{i}.c").write_text('#include "cudattn.h"\n' + fragment + "int main(void) { return 0; }\n")
        subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-Wno-unused-function", "-fsyntax-only",
                        *flags, str(tmp_path / f"fragment{i}.c")], check=True)
    assert "my_program.c -ldl -o my_program" in doc and "attention.c -ldl -lm -o attention" in doc
    (tmp_path / "my_program.c").write_text(src.replace('"cudattn_kernels"', f'"{out}"'))
    subprocess.run(["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", *flags, str(tmp_path / "my_program.c"),
                    "-ldl", "-o", str(tmp_path / "my_program")], check=True)
    res = _run(tmp_path / "my_program", out, _stand_in(tmp_path, flags))  # cuDeviceGet fails: "no GPU"
    assert (res.returncode, res.stderr) == (EXIT_NO_GPU, "no GPU\n"), res
