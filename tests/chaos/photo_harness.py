"""The photo chaos run: concurrent jobs of every photo lane over one shared set of real photos,
real worker processes, and seeded faults aimed at the workers that hold leases.

Jobs come in *waves*. A wave's jobs are submitted together, at a moment when no job that moves
photos (rename, archive) is active, so each names its photos by the path the store records for
them then, and that path is final until the wave's own movers run. Inside a wave, jobs overlap on a
"hot" set of photos, so a rename or an archive moves photos under the feet of the exif, upload,
analysis and bundle jobs of the same wave and of earlier ones still running (items read the
photo's current path from the store when claimed). The store's photo ids come from a first job
over every photo; the model of the files (``photo_model``) is keyed by them.

Faults: SIGKILL or SIGSTOP/SIGCONT of the process named by a running item's ``lease_owner``
(``host:pid:nonce``: the pid of the dramatiq *worker* process, a child of the ``dramatiq`` main
process whose process group the run started); workers started with failpoints armed at the step
boundaries of the file effects (``tests.chaos.failpoint_actors``: each hit fires with a
probability): a "zombie maker" that freezes at exif/rename boundaries and is thawed after its lease
expired, and a "killer" that dies at a boundary dealt from a deck of all of them; graceful SIGTERM;
Redis FLUSHALL; extra sweepers started and killed; cancel, pause and resume of jobs.

Beside the waves, a ``photojobs watch`` process (issue 38) watches a drop folder of its own (out of
the waves' roots) with the analysis lane: photos are dropped into it during the chaos (some written
in chunks, some with a sidecar written after them) and some, once analysed, moved into another
folder by hand. At the end every dropped photo must have exactly one analysis item among the
watcher's jobs, succeeded (no file lost, none twice; a move is no new item).

And beside them a *schedule* (issue 38): ``photojobs schedule add`` at the start, every
:data:`SCHEDULE_EVERY`, of a ``sync --lanes analysis`` of a folder of its own, which the sweepers
of the fleet run (they are killed and restarted by the faults); photos are put into that folder at
a few random moments (a rename into it: whole). At the end (``schedule_findings``): the schedule's
jobs (those whose roots are its folder) never overlap (each created after the one before finished,
``jobs.created_at`` vs ``job_ends.finished_at``), there are no more of them than the schedule's
``runs`` and its ``last_job`` is the newest, and every photo put into its folder has exactly one
analysis item among them, succeeded (no double run, no lost file).
"""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import piexif
from PIL import Image
from sqlalchemy import select
from sqlalchemy.orm import Session

from photojobs import schedules
from photojobs.api import Plan
from photojobs.cli_support import worker_command, worker_env
from photojobs.testing.samples import generate_samples, make_png
from photos.fileops import sha256_file
from photos.params import validate_params
from store import schedules as store_schedules
from store.control import ControlBusy
from store.jobs import PhotoInput
from store.lanes import PHOTO_LANES
from store.models import Item, Job, JobEnd, Photo
from tests import fork_server
from tests.chaos.checker import SETTLED_JOB_STATES
from tests.chaos.harness import PLAIN, ChaosJob, ChaosRun, EventTail, Worker
from tests.chaos.photo_model import Baseline, take_baseline
from tests.raw_support import make_raw, make_xmp_sidecar, preview_jpeg
from tests.support import ROOT, pid_of_owner

LANES = ["noop", *PHOTO_LANES]  # every worker serves every lane
DROPS = 24  # photos the run may drop into the watched folder
WATCH_DEBOUNCE = "1"
SCHEDULE_NAME = "chaos-sync"
SCHEDULE_EVERY = "2s"
SCHEDULE_PHOTOS = 8  # photos the run may put into the schedule's folder (2 at the start)
WORKERS = 4
THREADS = 2
# Of the WORKERS, while the faults last: one "zombie maker" (freezes at exif/rename boundaries, is
# thawed after its lease expired, and goes on) and one "killer" (dies at a boundary of the deck).
FAILPOINT_RATE = 0.25  # chance that one hit of an armed boundary fires
DATED_JPEGS, UNDATED_JPEGS, DATED_PNGS, UNDATED_PNGS = 26, 4, 3, 2
# Camera raws (never written; metadata to an XMP sidecar that moves with the raw): (name, make,
# model, capture time, the sidecar it starts with: None, "ext" = NAME.EXT.xmp, "stem" = NAME.xmp).
# The last is half of a RAW+JPEG pair: the first dated JPEG is renamed to its stem.
RAWS = (
    ("DSC_0100.NEF", "NIKON CORPORATION", "NIKON D750", "2021:07:04 18:30:05", None),
    ("IMG_0200.CR2", "Canon", "Canon EOS 5D Mark IV", "2022:03:12 09:15:30", "ext"),
    ("_DSC0300.ARW", "SONY", "ILCE-7M3", "2020:11:28 16:45:00", "stem"),
    ("IMG_0400.NEF", "NIKON CORPORATION", "NIKON Z 6", "2023:01:02 08:00:10", None),
)
PAIR_JPEG = "IMG_0400.jpg"
JPEG_SIDECARS = ("stem", "ext")  # the sidecars the 2nd and 3rd dated JPEGs start with
AVIFS = 2
HOT = 12  # photos most jobs of a wave share
WAVE_TIMEOUT = 180.0  # a wave whose movers have not settled by then is reported and cancelled
MAX_LINGERING = 4  # jobs that move no photo and may still run when the next wave comes
EFFECT_LANES = ("exif", "rename", "archive", "upload")
# Undo jobs (``photojobs undo``, issue 31): once at a random moment of the run, and from the second
# wave on once a wave (with this chance), a settled job (a shift, a rename, an archive, or an undo: a
# redo) is undone, racing the running jobs on the same photos (an undo refuses a photo a later job
# changed: "changed since").
UNDO_RATE = 1.0
UNDOABLE_KINDS = ("shift", "rename", "analysis_rename", "archive", "undo")
BOUNDARIES = ("after_stage", "after_record", "after_apply", "after_mark")
# What the zombie maker arms: a frozen exif or rename (a zombie with an effect in flight).
ZOMBIE_ARMED = ",".join(
    f"{p}:stop" for p in ("exif.after_stage", "exif.after_record", "exif.after_apply", "rename.after_record")
)

# Job kinds: lanes and parameters (filled in per job by ``job_params``).
KINDS: dict[str, list[str]] = {
    "analysis": ["analysis"],
    "shift": ["exif"],
    "keywords": ["exif"],
    "analysis_rename": ["analysis", "rename"],
    "rename": ["rename"],
    "upload": ["upload"],
    "archive": ["archive"],
    "bundle": ["analysis", "archive"],
    "noop": ["noop"],
}
EXTRA_KINDS = {"analysis": 1.0, "keywords": 1.5, "shift": 0.8, "upload": 1.2, "bundle": 0.6, "noop": 1.0}


# Per minute of chaos (at least 1 each): what a run must have seen to count as a test.
MINIMUM_PER_MINUTE = {
    "lease_expired": 4,
    "stale_commit_rejected": 1,
    "item_republished": 1,
    "item_deferred": 3,
    "effects_recovered": 1,
    "sigkill_holder": 2,
    "sigstop_holder_long": 1,
    "failpoint_kill": 1,
    "failpoint_stop": 0.5,
    "flushall": 0.5,
    "sweeper": 0.5,
    "pause": 1,
    "resume": 1,
    "cancel": 0.5,
    # items finished: 173-355 seen in 75 s under the parallel suite's load (2 cores, 4 test workers),
    # more on an idle machine; the bar is that the pipeline kept moving through the faults
    "items": 80,
    # items claimed with others of a batch message (analysis, noop): 15-61 seen in 75 s on an idle
    # machine, 2 under the parallel suite's load (a retried or revoked item rides alone, and a
    # dispatch spreads a small job over the fleet's threads): the run must see batch claims at all
    "batched_claims": 1,
    # undo jobs racing a wave's jobs (one per wave from the second: a short run has 2-3 waves)
    "undo": 0.5,
    # photos dropped into the watched folder (issue 38)
    "drop": 2,
}
#: A short run that has not proven its minimums by its length goes on dealing faults, up to this
#: many times its length.
UNPROVEN_LIMIT = 3.0
LONG_RUN_ITEMS = 1000  # a run of 5 minutes or more handles at least this many items


def minimums(seconds: float) -> dict[str, int]:
    out = {k: max(1, math.floor(v * seconds / 60)) for k, v in MINIMUM_PER_MINUTE.items()}
    if seconds >= 300:
        out["items"] = max(out["items"], LONG_RUN_ITEMS)
    for pair in os.environ.get("PHOTOJOBS_CHAOS_MINIMUMS", "").split(","):
        name, sep, value = pair.partition("=")
        if sep:
            out[name.strip()] = int(value)
    return out


@dataclass
class PhotoJob(ChaosJob):
    kind: str = ""
    lanes: list[str] = field(default_factory=list)
    params: dict[str, object] = field(default_factory=dict)
    photo_ids: list[int] = field(default_factory=list)
    wave: int = 0


@dataclass
class PhotoWorker(Worker):
    failpoints: str = ""
    killed: bool = False  # the run killed it (an exit is expected)
    started: float = field(default_factory=time.monotonic)


class DeadFleet(AssertionError):
    """Workers keep exiting on their own: the run cannot go on (the message holds their logs)."""


def make_photos(folder: Path, seed: int) -> list[Path]:
    """Real photos: dated JPEGs (with bursts; two with an editor's sidecar, ``JPEG_SIDECARS``),
    undated JPEGs, dated and undated PNGs, dated AVIFs, and camera raws (``RAWS``: with embedded
    previews; two with an editor's sidecar, one of a RAW+JPEG pair)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = generate_samples(folder, DATED_JPEGS + UNDATED_JPEGS, seed=seed % 1000, size=(240, 180))
    for p in paths[DATED_JPEGS:]:
        piexif.remove(str(p))  # no EXIF at all, pixels untouched
    for i in range(DATED_PNGS + UNDATED_PNGS):
        png = folder / f"scan {i:02d}.png"
        if i < DATED_PNGS:
            make_png(png, size=(96 + i, 64))  # dated 2020-05-17 10:30:00; sizes keep pixels unique
        else:
            make_png(png, size=(96 + i, 64), taken=None)
        paths.append(png)
    pair = paths[0].rename(folder / PAIR_JPEG)  # a dated JPEG: the JPEG half of the RAW+JPEG pair
    paths[0] = pair
    # JPEG+sidecar pairs: a Lightroom NAME.xmp and a darktable NAME.jpg.xmp beside dated JPEGs
    for k, (jpeg, form) in enumerate(zip(paths[1 : 1 + len(JPEG_SIDECARS)], JPEG_SIDECARS, strict=True)):
        xmp = folder / (f"{jpeg.name}.xmp" if form == "ext" else f"{jpeg.stem}.xmp")
        make_xmp_sidecar(
            xmp, keywords=(f"jpeg{k}", "chaos"), rating=k + 1, description=f"lr {k}", label="Blue"
        )
    for i in range(AVIFS):  # phone AVIFs with their capture time (pixels unique by colour and size)
        exif = Image.Exif()
        exif.get_ifd(0x8769)[0x9003] = f"2023:09:27 14:35:{10 + i:02d}"
        avif = folder / f"phone {i:02d}.avif"
        Image.new("RGB", (80 + 2 * i, 60), (20 + 60 * i, 160, 240 - 60 * i)).save(avif, exif=exif.tobytes())
        paths.append(avif)
    for i, (name, make, model, taken, sidecar) in enumerate(RAWS):
        raw = make_raw(
            folder / name,
            make=make,
            model=model,
            taken=taken,
            preview=preview_jpeg((160 + 8 * i, 120), (40 + 50 * i, 200 - 40 * i, 30 + 20 * i)),
        )
        paths.append(raw)
        if sidecar is not None:
            xmp = folder / (f"{raw.name}.xmp" if sidecar == "ext" else f"{raw.stem}.xmp")
            make_xmp_sidecar(
                xmp, keywords=(f"kept{i}", "chaos"), rating=i + 1, description=f"editor {i}", label="Red"
            )
    return paths


def process_states() -> dict[int, set[str]]:
    """{process group: state letters of its processes} (from /proc)."""
    out: dict[int, set[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2:
            out.setdefault(int(fields[2]), set()).add(fields[0])
    return out


@dataclass
class PhotoChaosRun(ChaosRun):
    root: Path = field(init=False)
    archive: Path = field(init=False)
    uploads: Path = field(init=False)
    baseline: dict[int, Baseline] = field(default_factory=dict)  # photo id -> before the run
    photo_ids: list[int] = field(default_factory=list)
    wave: int = 0
    wave_started: float = 0.0
    calm: bool = False
    failpoint_log: Path = field(init=False)
    deck: list[str] = field(default_factory=list)
    exits: list[str] = field(default_factory=list)  # unexpected worker exits
    findings: list[str] = field(default_factory=list)  # violations the run itself saw
    spawned: int = 0
    done: set[int] = field(default_factory=set)  # jobs seen terminal
    young_exits: int = 0  # workers in a row that exited on their own within 20 s of their start
    drop: Path = field(init=False)  # the watched folder (issue 38)
    staged: list[Path] = field(default_factory=list)  # photos still to drop
    dropped: dict[str, str] = field(default_factory=dict)  # where each dropped photo is -> its sha256
    watch_proc: subprocess.Popen[bytes] | None = None
    scheduled: Path = field(init=False)  # the schedule's folder (issue 38)
    sched_staged: list[Path] = field(default_factory=list)  # photos still to put there
    sched_added: dict[str, str] = field(default_factory=dict)  # photo put there -> its sha256
    sched_counts: dict[str, int] = field(default_factory=dict)  # the schedule's figures at the end

    def __post_init__(self) -> None:
        super().__post_init__()
        self.root = self.workdir / "photos"
        self.archive = self.workdir / "photos-archive"
        self.uploads = self.workdir / "photos-uploads"
        self.failpoint_log = self.workdir / "failpoints.log"
        self.drop = self.workdir / "drop"
        self.scheduled = self.workdir / "scheduled"
        self._freeze_lock = threading.Lock()
        self._watching = threading.Event()
        self.thaw_rng = random.Random(self.rng.random())  # the watcher thread's own, so runs replay

    # -- workers --------------------------------------------------------------------------------
    def _armed(self) -> str:
        """The next boundaries to arm: a shuffled deck of every boundary, so all get their turn."""
        if len(self.deck) < 4:
            every = [f"{lane}.{b}" for lane in EFFECT_LANES for b in BOUNDARIES]
            self.rng.shuffle(every)
            self.deck.extend(every)
        picked, self.deck = self.deck[:4], self.deck[4:]
        return ",".join(picked)

    def start_worker(self) -> Worker:
        roles = {
            w.failpoints == ZOMBIE_ARMED for w in self.workers if isinstance(w, PhotoWorker) and w.failpoints
        }
        if self.calm:
            armed = ""
        elif True not in roles:
            armed = ZOMBIE_ARMED
        elif False not in roles:
            armed = self._armed()
        else:
            armed = ""
        env = {**self.fleet.env, **worker_env(THREADS, {})}
        cmd = worker_command(LANES, THREADS)
        if armed:
            cmd[cmd.index("actors")] = "tests.chaos.failpoint_actors"
            env.update(
                PHOTOJOBS_FAILPOINTS=armed,
                PHOTOJOBS_CHAOS_FAILPOINT_RATE=str(FAILPOINT_RATE),
                PHOTOJOBS_CHAOS_FAILPOINT_SEED=f"{self.seed}-{self.spawned}",
                PHOTOJOBS_CHAOS_FAILPOINT_LOG=str(self.failpoint_log),
            )
        self.spawned += 1
        with open(self.fleet.logdir / f"worker-{len(self.fleet.procs)}.log", "ab") as log:
            proc = fork_server.popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log, start_new_session=True)
        self.fleet.procs.append(proc)
        w = PhotoWorker(proc, failpoints=armed)
        self.workers.append(w)
        if armed:
            self.note(f"worker pid {proc.pid} started with failpoints {armed}")
        return w

    def fired(self) -> list[tuple[int, int, str, str]]:
        """Failpoints that fired: (pid, process group, boundary, action)."""
        if not self.failpoint_log.exists():
            return []
        out = []
        for line in self.failpoint_log.read_text().splitlines():
            parts = line.split()
            if len(parts) == 4:
                out.append((int(parts[0]), int(parts[1]), parts[2], parts[3]))
        return out

    def fault_counts(self) -> Counter[str]:
        faults = Counter({k: v for k, v in self.actions.items()})
        for _, _, point, action in self.fired():
            faults[f"failpoint_{action}"] += 1
            faults[f"failpoint {point}:{action}"] += 1
        return faults

    def watch_freezes(self) -> None:
        """Schedule the thaw of workers a failpoint froze (they wake as zombies after 2.5-6 s)."""
        with self._freeze_lock:
            groups = process_states()
            for w in list(self.workers):
                if not isinstance(w, PhotoWorker) or w.frozen or w.proc.poll() is not None:
                    continue
                if "T" in groups.get(w.proc.pid, set()):
                    seconds = self.thaw_rng.uniform(2.5, 6.0)
                    w.thaw = threading.Timer(seconds, self._thaw, args=(w,))
                    w.thaw.daemon = True
                    w.thaw.start()
                    self.note(f"worker pid {w.proc.pid} froze at a failpoint; SIGCONT in {seconds:.1f}s")
            # A worker that is shutting down (SIGTERMed) and froze at a failpoint on its way out is
            # thawed at once: nothing else would wake it, and a frozen process that holds SQLite's
            # write lock (another of its threads was in a transaction) stalls the whole store.
            for proc in self.stopping:
                if proc.poll() is None and "T" in groups.get(proc.pid, set()):
                    self._signal(proc, signal.SIGCONT)
                    self.note(f"worker pid {proc.pid} froze at a failpoint while shutting down; SIGCONT now")

    def _freeze_watcher(self) -> None:
        # Its own thread: a worker may freeze while another of its threads holds SQLite's write lock,
        # and then every store call of the main loop waits for that lock; the thaw must not.
        while not self._watching.wait(0.2):
            self.watch_freezes()

    def maintain(self) -> None:
        """Thaw workers a failpoint froze (after a while: they wake as zombies), replace dead
        workers, keep a sweeper running; fail fast when workers keep dying on their own."""
        self.watch_freezes()
        fired_groups = {g for _, g, _, _ in self.fired()}
        for w in list(self.workers):
            code = w.proc.poll()
            if code is None:
                continue
            self.workers.remove(w)
            if w.thaw is not None:
                w.thaw.cancel()
            killed = isinstance(w, PhotoWorker) and w.killed
            if not killed and w.proc.pid not in fired_groups:
                self.exits.append(f"worker pid {w.proc.pid} exited with {code}")
                self.note(f"worker pid {w.proc.pid} exited on its own with {code}")
                young = time.monotonic() - w.started < 20 if isinstance(w, PhotoWorker) else False
                self.young_exits = self.young_exits + 1 if young else 0
                if self.young_exits >= 4:
                    raise DeadFleet(
                        f"workers keep exiting on their own: {self.exits}\n{self.fleet.logs()[-8000:]}"
                    )
            self.start_worker()
        if self.redis.proc is None or self.redis.proc.poll() is not None:
            raise DeadFleet("the private redis-server died")
        self.sweepers = [p for p in self.sweepers if p.poll() is None]
        if not self.sweepers:
            self.start_sweeper()

    # -- photos and jobs --------------------------------------------------------------------------
    def current_paths(self) -> dict[int, str]:
        with Session(self.engine) as s:
            return dict(s.execute(select(Photo.id, Photo.path).where(Photo.id.in_(self.photo_ids))).all())

    def job_params(self, kind: str, n: int) -> dict[str, object]:
        rng = self.rng
        if kind == "shift":
            return {"exif.shift": "+1h"}
        if kind == "keywords":
            return {"exif.keywords": f"chaos,wave{self.wave},job{n}"}
        if kind == "upload":
            return {"upload.target": str(self.uploads)}
        if kind == "archive":
            return {"archive.root": str(self.archive), "archive.bundle": "none"}
        if kind == "bundle":
            return {"archive.root": str(self.archive), "archive.bundle": "zip"}
        if kind == "noop":
            return {
                "noop.sleep": str(round(rng.uniform(0.05, 0.4), 2)),
                "noop.fail_if": rng.choice(["3", "7"]),
            }
        return {}

    def submit_job(self, kind: str, ids: list[int], paths: dict[int, str]) -> PhotoJob:
        lanes = KINDS[kind]
        params = validate_params(lanes, self.job_params(kind, len(self.jobs) + 1))
        chosen = sorted(ids)
        inputs = [PhotoInput(paths[i], None) for i in chosen]
        plan = Plan(
            lanes, params, inputs, [str(self.root), str(self.archive)], f"chaos-{self.seed}-{len(self.jobs)}"
        )
        job_id = self.client.submit(lanes, [], plan=plan).job_id
        job = PhotoJob(
            job_id,
            PLAIN,
            0.0,
            [p.path for p in inputs],
            kind=kind,
            lanes=lanes,
            params=params,
            photo_ids=chosen,
            wave=self.wave,
        )
        self.jobs.append(job)
        self.note(f"wave {self.wave}: submit job {job_id} {kind} {lanes} {params} over {len(chosen)} photos")
        return job

    def new_wave(self) -> None:
        rng = self.rng
        self.wave += 1
        self.wave_started = time.monotonic()
        paths = self.current_paths()
        ids = sorted(paths)
        hot = rng.sample(ids, min(HOT, len(ids)))
        # The second wave archives (moves photos out of the root), the others mostly rename.
        mover = (
            "archive"
            if self.wave == 2
            else rng.choices(["rename", "analysis_rename", "archive"], [4, 3, 1])[0]
        )
        kinds = ["shift", mover]
        names, weights = list(EXTRA_KINDS), list(EXTRA_KINDS.values())
        kinds += rng.choices(names, weights, k=rng.randint(3, 5))
        rng.shuffle(kinds)
        # The mover goes last: every job of the wave names the photos by the paths read above, which
        # stay true only until the mover starts moving them (a later job would name a moved photo's
        # old path, and its item would rightly fail with "file not found").
        kinds.sort(key=lambda k: k == mover)
        for kind in kinds:
            size = rng.randint(15, len(ids)) if kind == "noop" else rng.randint(6, 16)  # noop is cheap
            from_hot = rng.sample(hot, min(len(hot), max(2, int(size * 0.7))))
            rest = [i for i in ids if i not in from_hot]
            chosen = from_hot + rng.sample(rest, min(len(rest), size - len(from_hot)))
            job = self.submit_job(kind, chosen, paths)
            if rng.random() < 0.35:
                at = time.monotonic() - self.t0 + rng.uniform(0.3, 5.0)
                self.schedule.append((at, "pause", job.id))
                self.schedule.append((at + rng.uniform(0.5, 4.0), "resume", job.id))
            elif rng.random() < 0.12:
                self.schedule.append((time.monotonic() - self.t0 + rng.uniform(0.5, 6.0), "cancel", job.id))
        self.undo_due = self.wave >= 2 and rng.random() < UNDO_RATE

    def maybe_undo(self) -> None:
        """The wave's undo, once a settled earlier job has something left to undo (a job that
        changed nothing, or one still running, is passed over; tried again at the next tick)."""
        if getattr(self, "undo_due", False) and self.submit_undo() is not None:
            self.undo_due = False

    def act_undo(self) -> bool:
        """The run's forced undo (any wave, once a settled job has something left to undo)."""
        return self.submit_undo() is not None

    def submit_undo(self) -> PhotoJob | None:
        """Undo a settled job. Safe at any moment of a wave: it names its photos by the store's rows
        (``store.history.plan_undo``), whatever a mover moved already; it races the jobs running."""
        pool = [
            j for j in self.jobs if isinstance(j, PhotoJob) and j.kind in UNDOABLE_KINDS and j.id in self.done
        ]
        self.rng.shuffle(pool)
        for undone in pool:  # the first with something left to undo
            out = self.client.undo(undone.id)
            if out["job"] is not None:
                break
            self.note(f"wave {self.wave}: undo of job {undone.id} ({undone.kind}): {out['note']}")
        else:
            return None
        st = self.client.status(out["job"])
        with Session(self.engine) as s:
            ids = sorted(set(s.execute(select(Item.photo_id).where(Item.job_id == out["job"])).scalars()))
        job = PhotoJob(
            out["job"], PLAIN, 0.0, [], kind="undo", lanes=list(st.lane_order), params=dict(st.params),
            photo_ids=ids, wave=self.wave,
        )  # fmt: skip
        self.jobs.append(job)
        self.actions["undo"] += 1
        self.note(
            f"wave {self.wave}: submit job {job.id} undo of job {undone.id} ({undone.kind}) {job.lanes} "
            f"over {len(ids)} photos"
        )
        return job

    def wave_jobs(self) -> list[PhotoJob]:
        return [j for j in self.jobs if isinstance(j, PhotoJob) and j.wave == self.wave]

    def moves(self, job: PhotoJob) -> bool:
        """Whether the job can change photo paths (rename, or archive without a bundle)."""
        return "rename" in job.lanes or ("archive" in job.lanes and job.params.get("archive.bundle") != "zip")

    def wave_settled(self) -> bool:
        """True when the next wave may be submitted: no job that moves photos is still active (so
        every path the store records is final until the next wave's movers run) and at most
        ``MAX_LINGERING`` other jobs still are. Paused movers left over are resumed."""
        active = []
        for j in self.jobs:
            if j.id in self.done or not isinstance(j, PhotoJob):
                continue
            state = self.client.status(j.id).state
            if state in SETTLED_JOB_STATES and state != "paused":
                self.done.add(j.id)
            else:
                active.append((j, state))
        movers = [(j, st) for j, st in active if self.moves(j)]
        if movers and all(st == "paused" for _, st in movers):
            for j, _ in movers:
                if not j.cancelled:
                    self.resume(j, "end of the wave")
            return False
        if movers and time.monotonic() - self.wave_started > WAVE_TIMEOUT:
            stuck = {j.id: st for j, st in movers}
            self.findings.append(f"wave {self.wave}: jobs {stuck} did not settle within {WAVE_TIMEOUT:g}s")
            for j, _ in movers:
                if not j.cancelled:
                    self.cancel(j, "wave stuck")
            return False
        return not movers and len(active) <= MAX_LINGERING

    # -- job controls: an error (a deadlock between cancel and a bundle release) is a finding -------
    def _control(self, what: str, job: ChaosJob, why: str) -> None:
        # ControlBusy is tried again by the base harness (``_patiently``); one that stays busy
        # longer than the store promises comes here, a finding like any other error
        for attempt in range(1, 4):
            try:
                getattr(super(), what)(job, why)
                return
            except ControlBusy as exc:
                self.findings.append(f"{what} of job {job.id} stayed ControlBusy: {str(exc)[:300]}")
                break
            except Exception as exc:  # noqa: BLE001 - reported, then tried again
                self.findings.append(f"{what} of job {job.id} raised {type(exc).__name__}: {str(exc)[:300]}")
                self.note(f"{what} job {job.id} failed (attempt {attempt}): {type(exc).__name__}")
        if what == "cancel":  # the run must still end: note the cancel as wanted
            job.cancelled = True

    def pause(self, job: ChaosJob, why: str) -> None:
        self._control("pause", job, why)

    def resume(self, job: ChaosJob, why: str) -> None:
        self._control("resume", job, why)

    def cancel(self, job: ChaosJob, why: str) -> None:
        self._control("cancel", job, why)

    def log_findings(self) -> list[str]:
        """Deadlocks the workers and sweepers logged (PostgreSQL aborts one of the transactions)."""
        out = []
        for f in sorted(self.fleet.logdir.glob("*.log")):
            text = f.read_text(errors="replace")
            n = text.count("deadlock detected")
            if n:
                out.append(f"{f.name}: {n} transaction(s) aborted with 'deadlock detected'")
        return out

    # -- faults aimed at lease holders ------------------------------------------------------------
    def holders(self) -> list[tuple[int, str, int, PhotoWorker]]:
        """(item, lane, pid, worker) of running items whose lease owner is a live, unfrozen worker."""
        with Session(self.engine) as s:
            rows = s.execute(
                select(Item.id, Item.lane, Item.lease_owner).where(
                    Item.state == "running", Item.lease_owner.is_not(None)
                )
            ).all()
        out = []
        for item_id, lane, owner in rows:
            pid = pid_of_owner(owner)
            try:
                group = os.getpgid(pid)
            except ProcessLookupError:
                continue
            w = next((w for w in self.workers if w.proc.pid == group), None)
            if isinstance(w, PhotoWorker) and not w.frozen and w.proc.poll() is None:
                out.append((item_id, lane, pid, w))
        return out

    def _pick_holder(self) -> tuple[int, str, int, PhotoWorker] | None:
        found = self.holders()
        if not found:
            return None
        weights = [1.0 if lane == "noop" else 4.0 for _, lane, _, _ in found]
        return self.rng.choices(found, weights)[0]

    def act_kill_holder(self) -> bool:
        got = self._pick_holder()
        if got is None:
            return False
        item_id, lane, pid, w = got
        w.killed = True
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.actions["sigkill_holder"] += 1
        self.note(f"SIGKILL pid {pid}, lease holder of item {item_id} ({lane})")
        return True

    def act_freeze_holder(self, long: bool | None = None) -> bool:
        if sum(w.frozen for w in self.workers) >= 2:
            return False
        got = self._pick_holder()
        if got is None:
            return False
        item_id, lane, pid, w = got
        long = self.rng.random() < 0.6 if long is None else long
        seconds = self.rng.uniform(2.5, 6.0) if long else self.rng.uniform(0.2, 1.2)  # lease TTL 2 s
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            return False
        w.thaw = threading.Timer(seconds, self._thaw, args=(w,))
        w.thaw.daemon = True
        w.thaw.start()
        self.actions["sigstop_holder_long" if long else "sigstop_holder_short"] += 1
        self.note(f"SIGSTOP pid {pid}, lease holder of item {item_id} ({lane}), for {seconds:.1f}s")
        return True

    def act_freeze_holder_long(self) -> bool:
        return self.act_freeze_holder(long=True)

    def act_kill(self) -> None:
        """SIGKILL a whole worker (main process and child), whatever it holds."""
        w = self.workers[self.rng.randrange(len(self.workers))]
        if isinstance(w, PhotoWorker):
            w.killed = True
        if w.thaw is not None:
            w.thaw.cancel()
        self._kill(w.proc)
        self.actions["sigkill"] += 1
        self.note(f"SIGKILL worker pid {w.proc.pid}{' (frozen)' if w.frozen else ''}")

    def _controllable(self) -> list[PhotoJob]:
        return [j for j in self.jobs if isinstance(j, PhotoJob) and j.id not in self.done and not j.cancelled]

    def act_pause(self) -> None:
        pool = self._controllable()
        if pool:
            self.pause(pool[self.rng.randrange(len(pool))], "random")

    def act_resume(self) -> None:
        pool = [j for j in self._controllable() if j.pauses > j.resumes]
        if pool:
            self.resume(pool[self.rng.randrange(len(pool))], "random")

    def act_cancel(self) -> None:
        pool = self._controllable()
        if pool and sum(j.cancelled for j in self.jobs) < len(self.jobs) / 5:
            self.cancel(pool[self.rng.randrange(len(pool))], "random")

    PHOTO_ACTIONS: tuple[tuple[str, float], ...] = (
        ("kill_holder", 1.5),
        ("freeze_holder", 1.5),
        ("kill", 0.2),
        ("term", 0.3),
        ("flushall", 0.4),
        ("sweeper", 0.4),
        ("pause", 0.7),
        ("resume", 1.0),
        ("cancel", 0.25),
        ("drop", 0.6),
        ("move_dropped", 0.25),
        ("nothing", 1.0),
    )

    # -- the watched folder (issue 38) ------------------------------------------------------------
    def start_watcher(self) -> None:
        """``photojobs watch`` over the drop folder (analysis), and the photos it will be given."""
        self.drop.mkdir(parents=True, exist_ok=True)
        seed = (self.seed + 38) % 1000
        self.staged = generate_samples(self.workdir / "stage", DROPS, seed=seed, size=(200, 150))
        self.rng.shuffle(self.staged)
        out = open(self.fleet.logdir / "watch.log", "ab")  # noqa: SIM115
        command = ["watch", "--lanes", "analysis", "--json", "--debounce", WATCH_DEBOUNCE]
        command += ["--batch-wait", "0.5"]
        self.watch_proc = subprocess.Popen(
            [sys.executable, "-m", "photojobs", *command, str(self.drop)],
            cwd=ROOT, env=self.env, stdout=out, stderr=out, start_new_session=True,
        )  # fmt: skip
        self.fleet.procs.append(self.watch_proc)
        self.note(f"watcher pid {self.watch_proc.pid} on {self.drop}")

    def act_drop(self) -> bool:
        """Drop the next staged photo into the watched folder: whole, in chunks, or with a sidecar
        written after it (the watcher must wait for both)."""
        if not self.staged:
            return False
        source = self.staged.pop()
        data = source.read_bytes()
        target = self.drop / f"day {len(self.dropped) % 3}" / source.name
        target.parent.mkdir(exist_ok=True)
        how = self.rng.choice(["whole", "chunks", "sidecar"])
        with open(target, "wb") as out:
            if how == "chunks":  # a slow copy: pauses shorter than the debounce
                half = len(data) // 2
                out.write(data[:half])
                out.flush()
                time.sleep(0.3)
                out.write(data[half:])
            else:
                out.write(data)
        if how == "sidecar":
            time.sleep(0.3)
            make_xmp_sidecar(target.with_name(f"{target.name}.xmp"), keywords=("dropped",), rating=2)
        self.dropped[str(target)] = sha256_file(target)
        self.actions["drop"] += 1
        self.note(f"dropped {target} ({how})")
        return True

    def watch_items(self) -> dict[str, list[tuple[int, str]]]:
        """Path of each photo of the watcher's jobs -> its analysis items (id, state)."""
        with Session(self.engine) as s:
            jobs = [j for j, roots in s.execute(select(Job.id, Job.roots)) if roots == [str(self.drop)]]
            rows = s.execute(
                select(Photo.path, Item.id, Item.state)
                .join(Item, Item.photo_id == Photo.id)
                .where(Item.job_id.in_(jobs))
            ).all() if jobs else []  # fmt: skip
        out: dict[str, list[tuple[int, str]]] = {}
        for path, item, state in rows:
            out.setdefault(path, []).append((item, state))
        return out

    def act_move_dropped(self) -> bool:
        """Move a dropped photo that was analysed into another folder by hand (with its sidecar): a
        move, its photo keeps its id and gets no new item."""
        done = {p for p, its in self.watch_items().items() if its and all(st == "succeeded" for _, st in its)}
        ready = sorted(p for p in self.dropped if p in done and "/moved/" not in p)
        if not ready:
            return False
        old = Path(self.rng.choice(ready))
        new = self.drop / "moved" / old.name
        new.parent.mkdir(exist_ok=True)
        os.rename(old, new)
        side = old.with_name(f"{old.name}.xmp")
        if side.exists():
            os.rename(side, new.with_name(f"{new.name}.xmp"))
        self.dropped[str(new)] = self.dropped.pop(str(old))
        self.actions["move_dropped"] += 1
        self.note(f"moved {old} -> {new} by hand")
        return True

    def watch_findings(self, timeout: float) -> list[str]:
        """Every dropped photo, where it is now, has exactly one analysis item among the watcher's
        jobs and it succeeded (waited for up to ``timeout``: the watcher's last batches)."""

        def settled() -> bool:
            found = self.watch_items()
            ended = ("succeeded", "failed")
            return all(p in found and all(st in ended for _, st in found[p]) for p in self.dropped)

        deadline = time.monotonic() + timeout
        while not settled() and time.monotonic() < deadline:
            self.maintain()
            time.sleep(0.5)
        found = self.watch_items()
        out = []
        if self.watch_proc is not None and self.watch_proc.poll() is not None:
            out.append(f"the watcher exited with {self.watch_proc.returncode}")
        for path in sorted(self.dropped):
            items = found.get(path, [])
            if not items:
                out.append(f"watched folder: {path} was never submitted (lost)")
            elif len(items) > 1:
                out.append(f"watched folder: {path} has {len(items)} analysis items: {items}")
            elif items[0][1] != "succeeded":
                out.append(f"watched folder: {path}'s item {items[0][0]} is {items[0][1]}")
        extra = sorted(set(found) - set(self.dropped))
        if extra:
            out.append(f"watched folder: items for paths never dropped there: {extra[:5]}")
        self.note(f"watched folder: {len(self.dropped)} photos dropped, {len(found)} photos submitted")
        return out

    # -- the schedule (issue 38) -------------------------------------------------------------------
    def start_schedule(self) -> None:
        """``photojobs schedule add`` (its function) of a ``sync`` of the schedule's folder
        (analysis), with two photos in it already (its first run makes a job)."""
        self.scheduled.mkdir(parents=True, exist_ok=True)
        seed = (self.seed + 83) % 1000
        self.sched_staged = generate_samples(
            self.workdir / "stage-scheduled", SCHEDULE_PHOTOS, seed=seed, size=(200, 150)
        )
        self.rng.shuffle(self.sched_staged)
        self.act_schedule_photo()
        self.act_schedule_photo()
        # In process, through the function ``photojobs schedule add`` calls (the CLI's start-up took
        # 30 s under load, and held back the faults)
        command = ["sync", str(self.scheduled), "--lanes", "analysis"]
        schedules.add(self.client, SCHEDULE_NAME, command, every=SCHEDULE_EVERY)
        self.note(f"schedule {SCHEDULE_NAME} every {SCHEDULE_EVERY}: sync {self.scheduled} --lanes analysis")

    def act_schedule_photo(self) -> bool:
        """Put the next staged photo into the schedule's folder (renamed in: whole at once)."""
        if not self.sched_staged:
            return False
        source = self.sched_staged.pop()
        target = self.scheduled / source.name
        os.rename(source, target)
        self.sched_added[str(target)] = sha256_file(target)
        self.actions["schedule_photo"] += 1
        self.note(f"put {target} into the schedule's folder")
        return True

    def schedule_jobs(self) -> list[tuple[int, float, float | None]]:
        """The schedule's jobs (roots: its folder), oldest first: (id, created_at, finished_at)."""
        with Session(self.engine) as s:
            rows = s.execute(
                select(Job.id, Job.roots, Job.created_at, JobEnd.finished_at)
                .outerjoin(JobEnd, JobEnd.job_id == Job.id)
                .order_by(Job.created_at, Job.id)
            ).all()
        return [(j, c, f) for j, roots, c, f in rows if roots == [str(self.scheduled)]]

    def schedule_items(self, jobs: list[int]) -> dict[str, list[tuple[int, int, str]]]:
        """Path of each photo of ``jobs`` -> its analysis items (job, id, state)."""
        if not jobs:
            return {}
        with Session(self.engine) as s:
            rows = s.execute(
                select(Photo.path, Item.job_id, Item.id, Item.state)
                .join(Item, Item.photo_id == Photo.id)
                .where(Item.job_id.in_(jobs))
            ).all()
        out: dict[str, list[tuple[int, int, str]]] = {}
        for path, job, item, state in rows:
            out.setdefault(path, []).append((job, item, state))
        return out

    def schedule_findings(self, timeout: float) -> list[str]:
        """The schedule ran no two runs at once and lost no photo (waited for up to ``timeout``:
        its last runs pick up the last photos and their jobs finish): its jobs' lifetimes never
        overlap, they are no more than its ``runs`` (its ``last_job`` the newest), and each photo
        put into its folder has exactly one analysis item among them, succeeded."""

        def settled() -> bool:
            jobs = self.schedule_jobs()
            found = self.schedule_items([j for j, _, _ in jobs])
            ended = ("succeeded", "failed")
            return all(f is not None for _, _, f in jobs) and all(
                p in found and all(st in ended for _, _, st in found[p]) for p in self.sched_added
            )

        deadline = time.monotonic() + timeout
        while not settled() and time.monotonic() < deadline:
            self.maintain()
            time.sleep(0.5)
        jobs = self.schedule_jobs()
        found = self.schedule_items([j for j, _, _ in jobs])
        row = store_schedules.get(self.engine, SCHEDULE_NAME)
        out = []
        for (before, _, ended), (after, created, _) in zip(jobs, jobs[1:], strict=False):
            if ended is None or created < ended:
                out.append(
                    f"schedule: job {after} created at {created:.3f} while job {before} was unfinished "
                    f"(finished at {ended}): two runs at once"
                )
        if jobs and jobs[-1][2] is None:
            out.append(f"schedule: its last job {jobs[-1][0]} did not finish within {timeout:g}s")
        if len(jobs) > row.runs:
            out.append(f"schedule: {len(jobs)} jobs but runs={row.runs}")
        if row.last_job is not None and (not jobs or row.last_job != jobs[-1][0]):
            out.append(f"schedule: last_job {row.last_job} is not its newest job {jobs[-1:]}")
        for path in sorted(self.sched_added):
            items = found.get(path, [])
            if not items:
                out.append(f"schedule: {path} was never submitted (lost)")
            elif len(items) > 1:
                out.append(f"schedule: {path} has {len(items)} analysis items (job, item, state): {items}")
            elif items[0][2] != "succeeded":
                out.append(f"schedule: {path}'s item {items[0][1]} is {items[0][2]}")
        extra = sorted(set(found) - set(self.sched_added))
        if extra:
            out.append(f"schedule: items for paths never put in its folder: {extra[:5]}")
        self.sched_counts = {
            "runs": row.runs, "skipped": row.skipped, "jobs": len(jobs), "photos": len(self.sched_added),
        }  # fmt: skip
        self.note(f"schedule: {self.sched_counts}, last_error {row.last_error!r}")
        return out

    # -- the run -----------------------------------------------------------------------------------
    def start(self) -> None:
        self.t0 = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        made = make_photos(self.root, self.seed)
        before = take_baseline(made)
        self.tail = EventTail(self.env["PHOTOJOBS_DATABASE_URL"], self.seed)
        self.tail.start()
        # The first job names every photo: the store's photo ids for the baseline.
        self.wave = 1
        self.wave_started = time.monotonic()
        first = validate_params(["analysis"], {})
        plan = Plan(
            ["analysis"],
            first,
            [PhotoInput(str(p), None) for p in made],
            [str(self.root), str(self.archive)],
            "chaos-all",
        )
        job_id = self.client.submit(["analysis"], [], plan=plan).job_id
        with Session(self.engine) as s:
            ids = dict(
                s.execute(select(Photo.path, Photo.id).where(Photo.path.in_([str(p) for p in made]))).all()
            )
        self.baseline = {ids[str(p)]: before[str(p)] for p in made}
        self.photo_ids = sorted(self.baseline)
        self.jobs.append(
            PhotoJob(
                job_id,
                PLAIN,
                0.0,
                [str(p) for p in made],
                kind="analysis",
                lanes=["analysis"],
                params=first,
                photo_ids=self.photo_ids,
                wave=1,
            )
        )
        self.note(f"{len(made)} photos; wave 1: submit job {job_id} analysis over all of them")
        paths = self.current_paths()
        for kind in ("shift", "keywords", "rename", "upload", "bundle", "noop"):
            self.submit_job(kind, self.rng.sample(self.photo_ids, self.rng.randint(6, 12)), paths)
        # a run whose sweeper is SIGKILLed mid-sync is over after 15 s without a heartbeat (not the
        # default 300 s, longer than the run's end check waits for the schedule's photos)
        self.env["PHOTOJOBS_SCHEDULE_ABANDONED"] = self.fleet.env["PHOTOJOBS_SCHEDULE_ABANDONED"] = "15"
        self.start_sweeper()
        for _ in range(WORKERS):
            self.start_worker()
        self.start_watcher()
        self.start_schedule()
        self.await_first_claim()
        # One of each of these in the first half of the run, whatever the dice say (the short run can
        # then end once it has seen its minimums; the random faults go on all along)
        for fault in (
            "kill_holder", "freeze_holder_long", "flushall", "sweeper", "pause", "cancel", "undo",
            *["drop"] * minimums(self.seconds)["drop"],
        ):  # fmt: skip
            self.forced.append((self.rng.uniform(0.1, 0.5) * self.seconds, fault))
        for _ in range(3):  # photos for the schedule's folder at random moments
            self.forced.append((self.rng.uniform(0.05, 0.6) * self.seconds, "schedule_photo"))
        self.note(f"started {WORKERS} workers x {THREADS} threads (lanes {LANES}), 1 sweeper")
        threading.Thread(target=self._freeze_watcher, name="freeze-watcher", daemon=True).start()

    def await_first_claim(self, timeout: float = 180.0) -> None:
        """The run's clock starts once a worker has claimed an item: the forced faults are dealt in
        its first half, and under a loaded machine (the suite's heaviest tests start together) the
        fleet's boot took most of it — a FLUSHALL before the first claim republished the first wave
        alone, and a short run then never saw a batch message claimed (CI, 2026-12-07)."""
        assert self.tail is not None
        deadline = time.monotonic() + timeout
        while not any(e.type == "item_claimed" for e in list(self.tail.seen)):
            if time.monotonic() > deadline:
                raise AssertionError(f"no item claimed within {timeout:.0f} s of the fleet's start")
            time.sleep(0.1)
        self.note("first claim seen: the run's clock starts")
        self.t0 = time.monotonic()

    def chaos(self, proven: Callable[[], bool] | None = None) -> None:
        """Deal faults for the run's length; with ``proven``, until ``proven()`` says the run has seen
        enough (asked every 2 s) — beyond the run's length if it has not yet (a loaded machine deals
        fewer faults a second: CI's short runs ended one forced undo or one drop short), up to
        ``UNPROVEN_LIMIT`` times the length, after which the minimums' check names what is missing."""
        names = [a for a, _ in self.PHOTO_ACTIONS]
        weights = [w for _, w in self.PHOTO_ACTIONS]
        end = self.t0 + self.seconds * (UNPROVEN_LIMIT if proven is not None else 1)
        look = time.monotonic() + 2.0
        while time.monotonic() < end:
            if proven is not None and time.monotonic() >= look:
                look = time.monotonic() + 2.0
                if proven():
                    self.note(f"proved its minimums after {time.monotonic() - self.t0:.1f} s: the faults end")
                    break
            time.sleep(self.rng.uniform(0.3, 1.0))
            self.maintain()
            now = time.monotonic() - self.t0
            for due, fault in [f for f in self.forced if f[0] <= now]:
                if getattr(self, "act_" + fault)() is not False:
                    self.forced.remove((due, fault))
            self.run_due()
            self.maybe_undo()
            getattr(self, "act_" + self.rng.choices(names, weights)[0])()
            if self.wave_settled():
                self.new_wave()

    def calm_down(self) -> None:
        """End the faults: workers with failpoints go (killed), frozen ones thaw, paused jobs resume."""
        self.calm = True
        self._watching.set()
        for w in list(self.workers):
            if w.thaw is not None:
                w.thaw.cancel()
                self._thaw(w)
            if isinstance(w, PhotoWorker) and w.failpoints and w.proc.poll() is None:
                w.killed = True
                self._kill(w.proc)
                self.note(f"calm: worker pid {w.proc.pid} with failpoints killed")
        for proc in self.stopping:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.note(f"worker pid {proc.pid} did not stop within 30 s of SIGTERM; SIGKILL")
                self._kill(proc)
        self.maintain()
        self.schedule.clear()
        self.note(f"chaos over after {self.wave} wave(s): {dict(self.actions)}")

    def settle(self, timeout: float) -> dict[int, str]:
        """Keep the fleet whole and resume paused jobs until every job is terminal (or the deadline)."""
        deadline = time.monotonic() + timeout
        while True:
            self.maintain()
            states = {j.id: self.client.status(j.id).state for j in self.jobs}
            for j in self.jobs:
                if states[j.id] == "paused" and not j.cancelled:
                    self.resume(j, "settling")
            done = all(s in SETTLED_JOB_STATES and s != "paused" for s in states.values())
            if done or time.monotonic() > deadline:
                self.note(f"job states: {states}")
                return states
            time.sleep(0.5)
