"""One long-lived ``exiftool -stay_open`` process, shared by the threads of a process.

Starting exiftool costs ~100-200 ms of Perl start-up, so the photo work keeps one process per
worker process and feeds it commands through its argument file on stdin::

    exiftool -stay_open True -@ -

Each command is written one argument per line, followed by ``-echo4 {readyN}`` (printed on
stderr once the command has finished, with its exit status) and ``-executeN`` (which makes
exiftool print ``{readyN}`` on stdout). Both streams are read, without deadlocking on either,
until their marker. A lock serialises commands; a process that died is replaced on the next
call; a command that does not answer within ``timeout`` seconds kills the process.

exiftool does not exit when its stdin reaches EOF (``-stay_open`` keeps polling), so a worker
killed with SIGKILL would leave it running forever. On Linux it is therefore started through
``setpriv --pdeathsig KILL`` from a long-lived spawner thread (the parent-death signal follows
the *thread* that forked), and instances are closed at interpreter exit.

Which exiftool (:func:`executable`): ``$PHOTOJOBS_EXIFTOOL`` when set (a path or a name on PATH),
else the pinned ExifTool ``make`` installs next to the interpreter (``.venv/bin/exiftool``, see
pyproject.toml ``[tool.photojobs.exiftool]``), else the first ``exiftool`` on PATH.

Every process starts with :data:`CONFIG` (``-config``): exiftool's IPTC ``TimeCreated`` and
``DigitalCreationTime`` writers add the *worker's* local time zone to a time given without one
(``17:00:00`` became ``18:00:00+01:00`` under ``TZ=Europe/Berlin``); with the config a time keeps
exactly the zone it is given, and a time without one is written without one.
"""

from __future__ import annotations

import atexit
import os
import re
import selectors
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

from photos.errors import PhotoError
from photos.process_exit import at_exit

#: Arguments sent with every command: UTF-8 file names, and values written as given.
COMMON_ARGS: tuple[str, ...] = ("-charset", "filename=utf8", "-charset", "utf8")

_STATUS_RE = re.compile(rb"\{ready(\d+) status=(\d+)\}\r?\n?$")

#: How to install exiftool, named in every "not installed" error.
INSTALL_HINT = (
    "install it: make (the pinned ExifTool into .venv), apt-get install libimage-exiftool-perl "
    "(Debian/Ubuntu), brew install exiftool (macOS); or set PHOTOJOBS_EXIFTOOL"
)
#: Names the exiftool to run (a path, or a name looked up on PATH), before the pinned one and PATH.
ENV = "PHOTOJOBS_EXIFTOOL"


#: exiftool configuration every process is started with: IPTC times never gain a zone they were
#: not given (the stock writer fills in the machine's local zone).
CONFIG = r"""# photojobs: IPTC times keep the zone they are given; none is taken from the machine.
sub PhotojobsIptcTime($) {
    my $val = shift;
    return Image::ExifTool::IPTC::IptcTime($val)
        if $val =~ /\d{1,2}:?\d{2}:?\d{2}(\.\d*)?\s*([+-]\d{1,2}:?\d{2}|Z)\s*$/i;
    return undef unless $val =~ /\b(\d{1,2}):?(\d{2}):?(\d{2})(\.\d*)?\s*$/;
    return sprintf("%.2d%.2d%.2d", $1, $2, $3);
}
%Image::ExifTool::UserDefined = (
    'Image::ExifTool::IPTC::ApplicationRecord' => {
        60 => {
            Name => 'TimeCreated', Groups => { 2 => 'Time' }, Format => 'string[6,11]', Shift => 'Time',
            ValueConv => 'Image::ExifTool::Exif::ExifTime($val)',
            ValueConvInv => 'PhotojobsIptcTime($val)',
            PrintConv => '$self->Options("DateFormat") ? $self->ConvertDateTime("1970:01:01 $val") : $val',
            PrintConvInv => 'Image::ExifTool::IPTC::InverseDateOrTime($self,$val)',
        },
        63 => {
            Name => 'DigitalCreationTime', Groups => { 2 => 'Time' }, Format => 'string[6,11]',
            Shift => 'Time',
            ValueConv => 'Image::ExifTool::Exif::ExifTime($val)',
            ValueConvInv => 'PhotojobsIptcTime($val)',
            PrintConv => '$self->Options("DateFormat") ? $self->ConvertDateTime("1970:01:01 $val") : $val',
            PrintConvInv => 'Image::ExifTool::IPTC::InverseDateOrTime($self,$val)',
        },
    },
);
1;
"""


_config_file: tuple[int, str] | None = None
_config_memfd: tuple[int, int] | None = None
#: The name of a config file (only where there is no memfd): ``photojobs-exiftool-<pid>-<random>.config``.
CONFIG_PREFIX = "photojobs-exiftool-"


def config_source() -> tuple[str, tuple[int, ...]]:
    """Where exiftool reads :data:`CONFIG` from, and the descriptor it must inherit for that.

    On Linux an anonymous in-memory file (``memfd_create``: nothing in the temp folder, gone with
    the process) read as ``/dev/fd/N``; elsewhere :func:`config_path`'s private file."""
    global _config_memfd
    if hasattr(os, "memfd_create") and os.path.isdir("/dev/fd"):
        with _spawner_lock:
            pid = os.getpid()
            if _config_memfd is None or _config_memfd[0] != pid:  # a forked child makes its own
                fd = os.memfd_create("photojobs-exiftool-config", os.MFD_CLOEXEC)
                os.write(fd, CONFIG.encode("utf-8"))
                _config_memfd = (pid, fd)
            fd = _config_memfd[1]
        return f"/dev/fd/{fd}", (fd,)
    return config_path(), ()


def config_path() -> str:
    """A private copy of :data:`CONFIG` as a file (mode 0600, ``photojobs-exiftool-<pid>-…``; never a
    predictable shared path, since exiftool runs the file as Perl): made once per process, removed
    when the process ends (:func:`photos.process_exit.at_exit`), and a dead process's swept by the
    next one that makes its own."""
    global _config_file
    with _spawner_lock:
        pid = os.getpid()
        if _config_file is None or _config_file[0] != pid or not os.path.exists(_config_file[1]):
            sweep_dead_configs()
            fd, path = tempfile.mkstemp(prefix=f"{CONFIG_PREFIX}{pid}-", suffix=".config")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(CONFIG)
            _config_file = (pid, path)
            at_exit(_unlink_quietly, path)
        return _config_file[1]


def sweep_dead_configs(folder: str | None = None) -> list[str]:
    """Remove the config files of processes that are gone (``photojobs-exiftool-<pid>-….config``
    whose pid runs no more, and is this user's); the names removed."""
    folder = folder or tempfile.gettempdir()
    removed = []
    try:
        names = [n for n in os.listdir(folder) if n.startswith(CONFIG_PREFIX) and n.endswith(".config")]
    except OSError:
        return removed
    for name in names:
        pid = name[len(CONFIG_PREFIX) :].split("-", 1)[0]
        path = os.path.join(folder, name)
        try:
            mine = os.lstat(path).st_uid == os.getuid()
        except OSError:
            continue
        if pid.isdigit() and mine and not os.path.exists(f"/proc/{pid}"):
            _unlink_quietly(path)
            removed.append(name)
    return removed


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


#: Options whose argument is the next one. exiftool expands format codes (``%d %f %e %c``, also
#: ``%:9d``-style) in the argument of the output ones; every other argument that does not start
#: with ``-`` must be an absolute file name (so no name is ever read as an option).
_VALUE_OPTIONS = frozenset({"-charset", "-sep", "-api", "-d", "-lang"})
#: Output options: their argument must be absolute and hold no ``%`` in its folder (``-o``,
#: ``-srcfile``: nowhere); ``-tagsfromfile`` takes only ``@`` (the file itself).
_PATTERN_OPTIONS = frozenset({"-w", "-w!", "-w+", "-W", "-W!", "-W+"})
_OUTPUT_OPTIONS = frozenset({"-o", "-out", "-srcfile", "-tagsfromfile", *_PATTERN_OPTIONS})
#: Options no caller may send: they change how exiftool reads the argument stream itself.
_STREAM_OPTIONS = frozenset({"-@", "-stay_open", "-execute", "-common_args", "-config", "-echo4"})


class UnsafeArgument(PhotoError):
    """An argument exiftool would read differently from what the caller meant (a newline, a
    leading ``#`` or blank, a relative file name, a format code in an output name)."""


def encode_arguments(args: tuple[str | os.PathLike[str], ...]) -> list[bytes]:
    """The lines of one ``-stay_open`` command, checked so that exiftool reads exactly these
    arguments: its argument-file reader ends an argument at a newline, drops blank lines and lines
    starting with ``#`` (or un-escapes ``#[CSTR]`` ones) and strips leading white space; a file
    argument that does not start with ``/`` could be read as an option (``-execute``, ``-@``); and
    ``-o``/``-w``/``-srcfile``/``-tagsFromFile`` expand ``%d``-style codes. Raises
    :class:`UnsafeArgument` (naming no path) instead of passing any of these."""
    encoded: list[bytes] = []
    expect: str | None = None  # the option whose argument comes next
    for arg in args:
        raw = os.fsencode(arg) if isinstance(arg, os.PathLike) else arg.encode("utf-8", "surrogateescape")
        if b"\n" in raw or b"\r" in raw:
            raise UnsafeArgument(None, "an exiftool argument contains a newline")
        if not raw or raw[:1].isspace() or raw.startswith(b"#"):
            raise UnsafeArgument(None, "an exiftool argument is empty or starts with a blank or '#'")
        if expect is not None:
            _check_option_value(expect, raw)
            expect = None
        elif raw.startswith(b"-"):
            option = raw.split(b"=", 1)[0].decode("utf-8", "replace")
            name = option if option in _PATTERN_OPTIONS else option.lower()
            if name in _STREAM_OPTIONS or name.startswith("-execute"):
                raise UnsafeArgument(None, f"exiftool option {option} is reserved for the command stream")
            if name in _VALUE_OPTIONS or name in _OUTPUT_OPTIONS:
                expect = name
        elif not raw.startswith(b"/"):
            raise UnsafeArgument(None, "an exiftool file argument is not an absolute path")
        encoded.append(raw)
    if expect is not None:
        raise UnsafeArgument(None, f"exiftool option {expect} is missing its argument")
    return encoded


def _check_option_value(option: str, raw: bytes) -> None:
    if option not in _OUTPUT_OPTIONS:
        return
    if option == "-tagsfromfile":
        if raw != b"@":
            raise UnsafeArgument(None, "-tagsFromFile takes only '@' (the file being written)")
        return
    if not raw.startswith(b"/"):
        raise UnsafeArgument(None, f"the {option} argument is not an absolute path")
    folder, _, name = raw.rpartition(b"/")
    if b"%" in folder or (b"%" in name and option not in _PATTERN_OPTIONS):
        raise UnsafeArgument(None, f"the {option} argument holds '%' (exiftool would expand it)")


def private_folder(prefix: str) -> tempfile.TemporaryDirectory[str]:
    """A private (0700) temporary folder for exiftool to write into, whose path holds no ``%``
    (``$TMPDIR`` when it holds none, else ``/tmp``): an output name inside it is never expanded."""
    base = tempfile.gettempdir()
    if "%" in base or not os.path.isabs(base):
        base = "/tmp"  # noqa: S108 - only a parent: the folder itself is mkdtemp's (0700, random name)
    return tempfile.TemporaryDirectory(prefix=prefix.replace("%", "_"), dir=base)


class ExifToolDied(PhotoError):
    """The exiftool process died (or was killed) while running a command."""


def executable() -> str | None:
    """The exiftool to run: ``$PHOTOJOBS_EXIFTOOL``, else the pinned one installed next to this
    interpreter (``sys.prefix/bin/exiftool``: the virtualenv's), else ``exiftool`` on PATH; None
    when there is none."""
    given = os.environ.get(ENV)
    if given:
        return shutil.which(given)
    pinned = os.path.join(sys.prefix, "bin", "exiftool")
    if os.path.isfile(pinned) and os.access(pinned, os.X_OK):
        return pinned
    return shutil.which("exiftool")


def available() -> bool:
    """True when there is an exiftool to run (:func:`executable`)."""
    return executable() is not None


_spawner: tuple[int, ThreadPoolExecutor] | None = None
_spawner_lock = threading.Lock()
_instances: weakref.WeakSet[ExifTool] = weakref.WeakSet()


def _spawn(argv: list[str], pass_fds: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
    """Popen from one long-lived thread per process, so a parent-death signal fires only when
    the process itself ends (not when the worker thread that first needed exiftool exits)."""
    global _spawner
    with _spawner_lock:
        if _spawner is None or _spawner[0] != os.getpid():  # a fork does not inherit the thread
            _spawner = (os.getpid(), ThreadPoolExecutor(max_workers=1, thread_name_prefix="exiftool-spawner"))
        executor = _spawner[1]
    return executor.submit(
        subprocess.Popen,
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        close_fds=True,
        pass_fds=pass_fds,
    ).result()


@atexit.register
def _close_all() -> None:
    for tool in list(_instances):
        tool.close()


class ExifTool:
    """A persistent exiftool process; thread-safe, restarted when it dies.

    Use :meth:`shared` for the per-process singleton. ``execute`` returns exiftool's stdout
    and raises :class:`PhotoError` (with exiftool's stderr) when the command fails.
    """

    _shared: ClassVar[ExifTool | None] = None
    _shared_pid: ClassVar[int | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, executable: str | None = None, *, timeout: float = 60.0) -> None:
        self.executable = executable  # None: the one :func:`executable` finds when a process starts
        self.timeout = timeout
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._counter = 0
        _instances.add(self)

    # -- lifecycle -------------------------------------------------------------------------------
    @classmethod
    def shared(cls) -> ExifTool:
        """The process-wide instance (a fresh one after ``fork``: pipes are not shared)."""
        with cls._shared_lock:
            if cls._shared is None or cls._shared_pid != os.getpid():
                cls._shared = cls()
                cls._shared_pid = os.getpid()
            return cls._shared

    def available(self) -> bool:
        """True when this instance's executable can be found."""
        return self._which() is not None

    def _which(self) -> str | None:
        return shutil.which(self.executable) if self.executable is not None else executable()

    @property
    def pid(self) -> int | None:
        """The running process id, or None when no process is running."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _start(self) -> subprocess.Popen[bytes]:
        exe = self._which()
        if exe is None:
            name = self.executable or os.environ.get(ENV) or "exiftool"
            raise PhotoError(None, f"exiftool is not installed ({name!r} is not found); {INSTALL_HINT}")
        config, inherited = config_source()
        argv = [exe, "-config", config, "-stay_open", "True", "-@", "-"]
        setpriv = shutil.which("setpriv")
        if setpriv is not None:
            argv = [setpriv, "--pdeathsig", "KILL", "--", *argv]
        proc = _spawn(argv, inherited)
        self._proc = proc
        return proc

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            proc.kill()
        except OSError:
            pass
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - kill is not ignorable
            pass

    def close(self) -> None:
        """Ask exiftool to exit (``-stay_open False``); kill it if it does not."""
        with self._lock:
            proc = self._proc
            if proc is None:
                return
            if proc.poll() is None and proc.stdin is not None:
                try:
                    proc.stdin.write(b"-stay_open\nFalse\n")
                    proc.stdin.flush()
                    proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._kill()

    def __enter__(self) -> ExifTool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- commands --------------------------------------------------------------------------------
    def execute(self, *args: str | os.PathLike[str], retry_if_died: bool = False) -> str:
        """Run one exiftool command; return its stdout (UTF-8 text).

        Raises PhotoError when exiftool reports a non-zero status or an ``Error:`` line, when it
        dies, or when it does not answer within the timeout; :class:`UnsafeArgument` (before
        anything is sent) for an argument exiftool would read otherwise (see
        :func:`encode_arguments`): file names must be absolute, output names free of ``%``.
        ``retry_if_died``: the command may run again (it is idempotent), so a process that died
        while running it is restarted once.
        """
        return self.execute_with_warnings(*args, retry_if_died=retry_if_died)[0]

    def execute_with_warnings(
        self, *args: str | os.PathLike[str], retry_if_died: bool = False
    ) -> tuple[str, list[str]]:
        """:meth:`execute`, also returning exiftool's ``Warning:`` lines for the command."""
        try:
            return self._execute(args)
        except ExifToolDied:
            if not retry_if_died:
                raise
            return self._execute(args)

    def _execute(self, args: tuple[str | os.PathLike[str], ...]) -> tuple[str, list[str]]:
        encoded = encode_arguments((*COMMON_ARGS, *args))
        with self._lock:
            for attempt in (1, 2):
                proc = self._proc
                if proc is None or proc.poll() is not None:
                    self._kill()
                    proc = self._start()
                self._counter += 1
                n = self._counter
                payload = b"\n".join(
                    [*encoded, b"-echo4", b"{ready%d status=${status}}" % n, b"-execute%d" % n, b""]
                )
                try:
                    if proc.stdin is None:
                        raise RuntimeError('internal error: expected proc.stdin is not None')
                    proc.stdin.write(payload)
                    proc.stdin.flush()
                except (BrokenPipeError, OSError):
                    # It died before reading the command: nothing ran, so one retry is safe.
                    self._kill()
                    if attempt == 2:
                        raise PhotoError(None, "exiftool could not be started (stdin closed)") from None
                    continue
                out, err, status = self._read_answer(proc, n)
                return self._check(args, out, err, status)
        raise AssertionError("unreachable")  # pragma: no cover

    def _read_answer(self, proc: subprocess.Popen[bytes], n: int) -> tuple[bytes, bytes, int]:
        """Read stdout up to ``{readyN}`` and stderr up to ``{readyN status=S}``."""
        if not (proc.stdout is not None and proc.stderr is not None):
            raise RuntimeError('internal error: expected proc.stdout is not None and proc.stderr is not None')
        out_marker = b"{ready%d}" % n
        out, err = bytearray(), bytearray()
        out_done = err_done = False
        status: int | None = None
        deadline = time.monotonic() + self.timeout
        sel = selectors.DefaultSelector()
        try:
            sel.register(proc.stdout, selectors.EVENT_READ, "out")
            sel.register(proc.stderr, selectors.EVENT_READ, "err")
            while not (out_done and err_done):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self._kill()
                    raise PhotoError(None, f"exiftool did not answer within {self.timeout:g} s (killed)")
                for key, _ in sel.select(remaining):
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        self._kill()
                        raise ExifToolDied(
                            None,
                            "exiftool died while running a command: "
                            + bytes(err).decode("utf-8", "replace").strip(),
                        )
                    if key.data == "out":
                        out += chunk
                        idx = out.find(out_marker)
                        if idx >= 0:
                            del out[idx:]
                            out_done = True
                            sel.unregister(proc.stdout)
                    else:
                        err += chunk
                        m = _STATUS_RE.search(err)
                        if m and int(m.group(1)) == n:
                            status = int(m.group(2))
                            del err[m.start() :]
                            err_done = True
                            sel.unregister(proc.stderr)
        finally:
            sel.close()
        if status is None:
            raise RuntimeError('internal error: expected status is not None')
        return bytes(out), bytes(err), status

    @staticmethod
    def _check(args: tuple[object, ...], out: bytes, err: bytes, status: int) -> tuple[str, list[str]]:
        text_err = err.decode("utf-8", "replace").strip()
        errors = [line for line in text_err.splitlines() if line.startswith("Error")]
        if status != 0 or errors:
            target = next((str(a) for a in reversed(args) if not str(a).startswith("-")), None)
            reason = "; ".join(errors) or text_err or f"exiftool exited with status {status}"
            raise PhotoError(target, f"exiftool failed: {reason}")
        warnings = [line.strip() for line in text_err.splitlines() if line.startswith("Warning")]
        return out.decode("utf-8", "replace"), warnings
