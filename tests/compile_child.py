"""A Python child process, without TRITON_INTERPRET, that runs compile snippets for sm_90 on request.

Under the interpreter the shared @triton.jit helpers are interpreted functions, which a Gluon kernel cannot call, so
the compile-only tests compile in a child process. One child per test worker, kept for the session: each snippet
pays the imports of torch, Triton and the kernels (about 6 s of CPU here) once per worker, not once per row.
"""

import json
import os
import subprocess
import sys

# the child: each request line is {"code": ..., "argv": [...]}; the code runs with sys.argv = ["-c", *argv] and its
# prints captured; the reply line is {"returncode": 0 or 1, "stdout": ..., "stderr": ...}, as subprocess.run gives
_SERVE = r"""
import contextlib, io, json, sys, traceback
replies = sys.stdout
for line in sys.stdin:
    request = json.loads(line)
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv = ["-c", *request["argv"]]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            exec(compile(request["code"], "<snippet>", "exec"), {"__name__": "__main__"})
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
    replies.write(json.dumps({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()}) + "\n")
    replies.flush()
"""


class CompileChild:
    """run(code, argv) -> subprocess.CompletedProcess, as subprocess.run([python, "-c", code, *argv]) would give,
    in a child kept alive between calls (started again if it died)."""

    def __init__(self) -> None:
        self.env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
        src = os.path.join(os.path.dirname(__file__), "..", "src")
        self.env["PYTHONPATH"] = os.pathsep.join([src, self.env.get("PYTHONPATH", "")])
        self.proc = None

    def run(self, code: str, argv: list[str]) -> subprocess.CompletedProcess:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-u", "-c", _SERVE], env=self.env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.proc.stdin.write(json.dumps({"code": code, "argv": argv}) + "\n")
        self.proc.stdin.flush()
        reply = self.proc.stdout.readline()
        if not reply:  # the child died (a crash inside a compiler): report it, start another next time
            self.close()
            return subprocess.CompletedProcess(argv, -1, "", "the compile child died")
        reply = json.loads(reply)
        return subprocess.CompletedProcess(argv, reply["returncode"], reply["stdout"], reply["stderr"])

    def close(self) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait()
            self.proc = None
