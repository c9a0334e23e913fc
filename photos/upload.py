"""Uploads to a local directory or an S3 bucket, never overwriting and always verified.

Plan / do split for the runtime's exactly-once protocol:

* plan (pure): :func:`parse_target`, :func:`object_key`, :meth:`LocalTarget.destination`,
  :meth:`S3Target.full_key` / :meth:`S3Target.location`;
* do: :meth:`LocalTarget.stage` + :meth:`LocalTarget.publish` (or :meth:`LocalTarget.upload` for both),
  :meth:`S3Target.upload` (resumable multipart through a caller-stored checkpoint).

Both targets are no-clobber: if the destination already holds the same content (sha256) the upload
is a no-op reported as ``already_present``; if it holds different content a :class:`PhotoError`
("conflict") is raised and nothing is overwritten.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import math
import mimetypes
import os
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal
from urllib.parse import urlsplit

from botocore.exceptions import ClientError, ConnectTimeoutError, EndpointConnectionError, NoCredentialsError

from photos import rootfs
from photos.errors import InvalidParameter, PatternError, PhotoError
from photos.fileops import content_sha256, write_new
from photos.rename import check_relpath, normalize_ext, render, resolve_target
from photos.rootfs import Roots, ensure_folder

# Content types of the photo formats (and sidecars) whatever the machine's mime.types says.
for _suffix, _type in ((".avif", "image/avif"), (".jxl", "image/jxl"), (".heic", "image/heic"),
                       (".heif", "image/heif"), (".xmp", "application/rdf+xml")):  # fmt: skip
    mimetypes.add_type(_type, _suffix)

MiB = 1024 * 1024
MIN_PART_SIZE = 5 * MiB
MAX_PARTS = 10_000
DEFAULT_MULTIPART_THRESHOLD = 8 * MiB
DEFAULT_PART_SIZE = 8 * MiB
DEFAULT_REGION = "us-east-1"

_CHUNK = MiB
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_TAG_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BUCKET_RE = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_UNREACHABLE_HINT = "check the endpoint URL and that the service is running"


@dataclass(frozen=True)
class UploadResult:
    """Outcome of one upload: where the content is, its sha256, and whether it was already there."""

    key: str
    location: str
    sha256: str
    already_present: bool


@dataclass(frozen=True)
class RemoteObject:
    """A stored object's identity as ``HeadObject`` reports it (metadata keys lower-cased)."""

    etag: str
    size: int
    metadata: dict[str, str]


# --------------------------------------------------------------------------------------------- helpers


def _check_sha(sha256: str) -> str:
    if not isinstance(sha256, str) or not _SHA_RE.fullmatch(sha256.lower()):
        raise InvalidParameter(f"sha256 {sha256!r} is not 64 hex digits")
    return sha256.lower()


def _check_source(src: Path) -> int:
    """Size of ``src``; PhotoError naming it if it is missing or not a regular file."""
    try:
        st = os.stat(src)
    except FileNotFoundError:
        raise PhotoError(src, "source file to upload is missing") from None
    except OSError as exc:
        raise PhotoError(src, f"source file cannot be read: {exc.strerror}") from None
    if not Path(src).is_file():
        raise PhotoError(src, "source to upload is not a regular file")
    return st.st_size


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _check_content(src: Path, sha256: str) -> None:
    actual = _hash_file(src)
    if actual != sha256:
        raise PhotoError(src, f"content changed since analysis: sha256 is {actual}, expected {sha256}")


def _check_key(key: str) -> str:
    try:
        check_relpath(key)
    except PatternError as exc:
        raise InvalidParameter(f"upload key {key!r} is not usable: {exc}") from None
    return key


def _b64(hex_digest: str) -> str:
    return base64.b64encode(bytes.fromhex(hex_digest)).decode("ascii")


def _conflict(src: Path, where: str, found: str, expected: str) -> PhotoError:
    return PhotoError(
        src, f"conflict: {where} already holds different content (sha256 {found}, expected {expected}); "
        "not overwritten"
    )


# ---------------------------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class UploadTarget:
    """A parsed upload destination: a local directory (``root``) or an S3 ``bucket`` + ``prefix``."""

    kind: Literal["local", "s3"]
    root: Path | None = None
    bucket: str | None = None
    prefix: str = ""
    endpoint_url: str | None = None

    def describe(self) -> str:
        """Human-readable form, e.g. ``s3://photos/backup (endpoint http://127.0.0.1:9000)``."""
        if self.kind == "local":
            return str(self.root)
        text = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        return f"{text} (endpoint {self.endpoint_url})" if self.endpoint_url else text

    def connect(self, client: Any = None, *, within: list[Path] | None = None) -> LocalTarget | S3Target:
        """The target object that performs uploads (``client`` is an optional boto3 S3 client;
        ``within``: the real roots a local folder is made beneath, see :class:`LocalTarget`)."""
        if self.kind == "local":
            if self.root is None:
                raise RuntimeError('internal error: expected self.root is not None')
            return LocalTarget(self.root, within=within)
        if self.bucket is None:
            raise RuntimeError('internal error: expected self.bucket is not None')
        return S3Target(self.bucket, self.prefix, endpoint_url=self.endpoint_url, client=client)


def _parse_endpoint(endpoint: str) -> str:
    parts = urlsplit(endpoint.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise InvalidParameter(
            f"S3 endpoint {endpoint!r} is not valid; give http(s)://host[:port], e.g. http://127.0.0.1:9000"
        )
    try:
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        raise InvalidParameter(f"S3 endpoint {endpoint!r} has an invalid port") from None
    if parts.query or parts.fragment:
        raise InvalidParameter(f"S3 endpoint {endpoint!r} must not have a query or fragment")
    return endpoint.strip().rstrip("/")


def parse_target(spec: str, endpoint: str | None = None) -> UploadTarget:
    """Parse an upload target: a local directory path or ``s3://bucket[/prefix]``.

    ``endpoint`` (an S3-compatible service URL such as MinIO or moto) only applies to ``s3://``
    targets. Raises :class:`InvalidParameter` with the reason for anything malformed.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidParameter("upload target is empty; give a local directory or s3://bucket/prefix")
    spec = spec.strip()
    scheme, sep, rest = spec.partition("://")
    if sep and re.fullmatch(r"[A-Za-z][A-Za-z0-9+.-]*", scheme):
        if scheme.lower() != "s3":
            raise InvalidParameter(
                f"upload target {spec!r}: {scheme}:// is not supported; use a local directory or "
                "s3://bucket/prefix"
            )
        return _parse_s3(spec, rest, endpoint)
    if spec.lower().startswith("s3:"):
        raise InvalidParameter(f"upload target {spec!r}: write S3 targets as s3://bucket/prefix")
    if endpoint:
        raise InvalidParameter(
            f"an S3 endpoint ({endpoint!r}) was given but the upload target {spec!r} is a local directory; "
            "the endpoint only applies to s3:// targets"
        )
    if "\x00" in spec:
        raise InvalidParameter(f"upload target {spec!r} contains a NUL character")
    root = Path(spec).expanduser().absolute()
    if root.exists() and not root.is_dir():
        raise InvalidParameter(f"upload target {spec!r} exists and is not a directory")
    return UploadTarget(kind="local", root=root)


def _parse_s3(spec: str, rest: str, endpoint: str | None) -> UploadTarget:
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise InvalidParameter(f"upload target {spec!r} has no bucket; write s3://bucket/prefix")
    if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket or re.fullmatch(r"[\d.]+", bucket):
        raise InvalidParameter(
            f"upload target {spec!r}: bucket name {bucket!r} is not valid (3-63 lower-case letters, "
            "digits, '.' and '-', starting and ending with a letter or digit)"
        )
    prefix = prefix.strip("/")
    if prefix:
        try:
            check_relpath(prefix)
        except PatternError as exc:
            raise InvalidParameter(f"upload target {spec!r}: prefix is not usable: {exc}") from None
    return UploadTarget(
        kind="s3", bucket=bucket, prefix=prefix, endpoint_url=_parse_endpoint(endpoint) if endpoint else None
    )


def object_key(
    pattern: str | None, facts: Mapping[str, Any], original: Path, file_mtime: float | None = None
) -> str:
    """The key (relative path) for one photo at the upload target.

    Without a pattern the key is content-addressed: ``{sha256[:2]}/{sha256}{ext}``. With a pattern it
    is rendered like a rename pattern (:func:`photos.rename.render`, same fields and validation);
    ``file_mtime`` (default: the original's mtime) is the fallback capture time.
    """
    original = Path(original)
    if pattern is None:
        sha = str(facts.get("sha256") or "").lower()
        if not _SHA_RE.fullmatch(sha):
            raise PhotoError(original, f"analysis has no valid sha256 (got {sha!r}); cannot build the key")
        return f"{sha[:2]}/{sha}{normalize_ext(original, facts.get('format'))}"
    if file_mtime is None:
        try:
            file_mtime = original.stat().st_mtime
        except OSError as exc:
            raise PhotoError(original, f"cannot read the file time for the key: {exc.strerror}") from None
    return render(pattern, facts, original, file_mtime).relpath


# ------------------------------------------------------------------------------------------- local do


class LocalTarget:
    """Uploads into a local directory ``root``: staged, fsynced, published with ``linkat`` (no
    clobber). Every name is reached beneath the folder's real path by descriptor, no symlink
    followed (``photos.rootfs``); the folder itself is made when missing — beneath ``within`` (the
    real roots a confined job was given), else by its path."""

    def __init__(self, root: Path, *, within: list[Path] | None = None) -> None:
        self.root = Path(root).expanduser().absolute()
        self.within = within
        self._fs = Roots([Path(os.path.realpath(self.root))])

    def destination(self, key: str) -> Path:
        """Plan: the absolute destination for ``key``; :class:`OutsideRoot` if it would leave the root."""
        return resolve_target(self.root, _check_key(key))

    def staged_path(self, key: str, stage_tag: str) -> Path:
        """Plan: where :meth:`stage` puts the temporary copy (``.{name}.pj-{tag}.tmp`` next to the target)."""
        if not isinstance(stage_tag, str) or not _TAG_RE.fullmatch(stage_tag):
            raise InvalidParameter(f"stage tag {stage_tag!r} must be 1-64 letters, digits, '_' or '-'")
        dest = self.destination(key)
        return dest.with_name(f".{dest.name}.pj-{stage_tag}.tmp")

    def stage(self, src: Path, key: str, sha256: str, stage_tag: str) -> Path:
        """Do: copy ``src`` to :meth:`staged_path` (fsynced, mtime kept) and check its sha256.

        Creates missing folders (beneath the root, none followed). Raises :class:`PhotoError` if
        ``src`` is missing or its content does not hash to ``sha256``; a stale staged file with the
        same tag is replaced (never written through).
        """
        src, sha256 = Path(src), _check_sha(sha256)
        _check_source(src)
        staged = self.staged_path(key, stage_tag)
        if not self.root.is_dir():
            ensure_folder(self.root, self.within)
        digest = hashlib.sha256()

        def copy(out: BinaryIO) -> None:
            with open(src, "rb") as fh:
                while chunk := fh.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                out.flush()
                st = os.fstat(fh.fileno())
                os.utime(out.fileno(), ns=(st.st_atime_ns, st.st_mtime_ns))
            if digest.hexdigest() != sha256:
                raise PhotoError(
                    src, f"content changed since analysis: sha256 is {digest.hexdigest()}, expected {sha256}"
                )

        write_new(staged, copy, within=self._fs)
        return staged

    def publish(self, staged: Path, key: str, sha256: str) -> UploadResult:
        """Do: link ``staged`` to the destination without overwriting, then remove ``staged``.

        Idempotent: if the destination already holds ``sha256`` (an earlier publish, or a staged file
        already consumed) the result is ``already_present``; different content raises a conflict.
        """
        staged, sha256 = Path(staged), _check_sha(sha256)
        dest = self.destination(key)
        present = False
        with self._fs.folders(staged, dest) as [(sf, sname), (df, dname)]:
            try:
                rootfs.link(sf, sname, df, dname)
            except FileExistsError:
                present = True
            except FileNotFoundError:
                if df.lstat(dname) is None:
                    raise PhotoError(staged, f"staged file is missing and {dest} does not exist") from None
                present = True
            except OSError as exc:
                raise PhotoError(
                    dest, f"cannot publish {staged.name}: {exc.strerror} (the file system needs hard links)"
                ) from None
            if present:
                self._check_existing(staged, dest, sha256)
            sf.delete(sname, missing_ok=True)
            df.fsync()
        return UploadResult(key=key, location=str(dest), sha256=sha256, already_present=present)

    def upload(self, src: Path, key: str, sha256: str, stage_tag: str) -> UploadResult:
        """Stage and publish ``src`` as ``key``; no-op (``already_present``) if the same content is there."""
        src, sha256 = Path(src), _check_sha(sha256)
        _check_source(src)
        dest = self.destination(key)
        if os.path.lexists(dest):
            self._check_existing(src, dest, sha256)
            return UploadResult(key=key, location=str(dest), sha256=sha256, already_present=True)
        return self.publish(self.stage(src, key, sha256, stage_tag), key, sha256)

    def _check_existing(self, src: Path, dest: Path, sha256: str) -> None:
        found = content_sha256(dest, within=self._fs)
        if found is None:
            raise PhotoError(src, f"conflict: {dest} exists and is not a regular file; not overwritten")
        if found != sha256:
            raise _conflict(src, str(dest), found, sha256)


# ---------------------------------------------------------------------------------------------- S3 do


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def _status(exc: Exception) -> int:
    response = getattr(exc, "response", None) or {}
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _is_precondition_failed(exc: Exception) -> bool:
    return _error_code(exc) == "PreconditionFailed" or _status(exc) == 412


def _is_not_found(exc: Exception) -> bool:
    return _error_code(exc) in ("404", "NoSuchKey", "NotFound") or _status(exc) == 404


def _etag(value: str) -> str:
    return value.strip().strip('"')


class S3Target:
    """Uploads into ``s3://bucket/prefix`` (AWS or an S3-compatible ``endpoint_url``).

    Credentials come from the usual environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_SESSION_TOKEN``, profiles); the region from ``AWS_REGION``/``AWS_DEFAULT_REGION``, default
    ``us-east-1``. Pass ``client`` to use a ready boto3 S3 client instead.

    No-clobber: every upload first looks (``HeadObject``; an existing object is compared, nothing
    is sent), then writes conditionally (``If-None-Match: *`` on ``PutObject`` and
    ``CompleteMultipartUpload``, honoured by AWS S3 and moto), so a writer that appears between
    the look and the write is not overwritten either: the write fails with 412 and the object is
    compared. On a server that ignores ``If-None-Match`` (some older S3-compatible stores) only the
    look protects, leaving that window as a race in which the other writer could be overwritten.
    Every upload is verified afterwards by re-reading the object and hashing it.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        client: Any = None,
        max_attempts: int = 3,
    ) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        if client is None:
            client = self._make_client(endpoint_url, max_attempts)
        self.client = client
        meta = getattr(client, "meta", None)
        self.endpoint = endpoint_url or getattr(meta, "endpoint_url", None) or "AWS S3"

    @staticmethod
    def _make_client(endpoint_url: str | None, max_attempts: int) -> Any:
        # boto3 is imported here, not at the top: 0.2 s of CPU that every worker process would pay at
        # boot (and every test that starts one), though only the S3 targets use it
        import boto3
        from botocore.config import Config

        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or DEFAULT_REGION
        config = Config(
            retries={"max_attempts": max_attempts, "mode": "standard"},
            connect_timeout=10,
            read_timeout=120,
            s3={"addressing_style": "path"} if endpoint_url else {},
        )
        session = boto3.session.Session()
        return session.client("s3", region_name=region, endpoint_url=endpoint_url, config=config)

    # ------------------------------------------------------------------------------------------ plan

    def full_key(self, key: str) -> str:
        """Plan: the object key for ``key`` (prefix joined with ``/``)."""
        _check_key(key)
        full = f"{self.prefix}/{key}" if self.prefix else key
        if len(full.encode("utf-8")) > 1024:
            raise InvalidParameter(f"S3 key {full[:60]!r}... is longer than 1024 bytes")
        return full

    def location(self, key: str) -> str:
        """Plan: ``s3://bucket/full-key`` for ``key``."""
        return f"s3://{self.bucket}/{self.full_key(key)}"

    # -------------------------------------------------------------------------------------------- do

    def upload(
        self,
        src: Path,
        key: str,
        sha256: str,
        checkpoint: Mapping[str, Any] | None = None,
        save_checkpoint: Callable[[dict[str, Any]], None] | None = None,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        part_size: int = DEFAULT_PART_SIZE,
        metadata: Mapping[str, str] | None = None,
    ) -> UploadResult:
        """Upload ``src`` as ``key`` unless the object exists; verify what is stored.

        Files smaller than ``multipart_threshold`` go in one conditional ``PutObject`` (with
        ``ChecksumSHA256`` and ``sha256`` metadata). Larger ones use a multipart upload; after each
        part ``save_checkpoint`` receives ``{"bucket", "key", "upload_id", "sha256", "part_size",
        "parts": [{"PartNumber", "ETag", "sha256"}]}``. Calling again with that ``checkpoint``
        resumes: parts still listed by ``ListParts`` with the same ETag and whose local bytes still
        hash to the recorded sha256 are skipped. If the object exists with the same sha256 the
        result is ``already_present``; with different content a :class:`PhotoError` (conflict).
        Unreachable endpoints, missing buckets, missing credentials and refused access raise
        :class:`PhotoError`; other S3 errors propagate (transient, retry). ``metadata``: further
        user metadata written with a new object (who uploaded it: ``photojobs-job``/``-item``).
        """
        src, sha256 = Path(src), _check_sha(sha256)
        if part_size < MIN_PART_SIZE:
            raise InvalidParameter(f"part_size {part_size} is below the S3 minimum of {MIN_PART_SIZE} bytes")
        if multipart_threshold < 0:
            raise InvalidParameter(f"multipart_threshold {multipart_threshold} must be >= 0")
        full = self.full_key(key)
        size = _check_source(src)
        _check_content(src, sha256)
        meta = {**dict(metadata or {}), "sha256": sha256}
        with self._errors(src, full):
            if size < multipart_threshold:
                created = self._put(src, full, meta, size)
            else:
                save = save_checkpoint or (lambda state: None)
                part_size = max(part_size, math.ceil(size / MAX_PARTS))
                created = self._multipart(src, full, meta, size, dict(checkpoint or {}), save, part_size)
            if created:
                self._verify_created(src, full, sha256)
            else:
                self._check_existing(src, full, sha256)
        return UploadResult(key=key, location=f"s3://{self.bucket}/{full}", sha256=sha256,
                            already_present=not created)

    @contextmanager
    def _errors(self, src: Path, full: str) -> Iterator[None]:
        where = f"s3://{self.bucket}/{full}"
        try:
            yield
        except (EndpointConnectionError, ConnectTimeoutError) as exc:
            raise PhotoError(
                src,
                f"cannot reach S3 endpoint {self.endpoint} to upload {where} ({_UNREACHABLE_HINT}): {exc}",
            ) from None
        except NoCredentialsError:
            raise PhotoError(
                src, f"no AWS credentials to upload {where}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
            ) from None
        except ClientError as exc:
            code = _error_code(exc)
            if code == "NoSuchBucket":
                raise PhotoError(src, f"bucket {self.bucket!r} does not exist at {self.endpoint}") from None
            if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "AllAccessDisabled"):
                raise PhotoError(src, f"S3 at {self.endpoint} refused access to {where}: {code}") from None
            raise

    def _put(self, src: Path, full: str, meta: dict[str, str], size: int) -> bool:
        """Look, then conditional single put; True if we created the object, False if it existed."""
        sha256 = meta["sha256"]
        if self._head(full) is not None:
            return False
        with open(src, "rb") as body:
            try:
                self.client.put_object(
                    Bucket=self.bucket, Key=full, Body=body, ContentLength=size, IfNoneMatch="*",
                    ChecksumSHA256=_b64(sha256), Metadata=meta,
                    ContentType=mimetypes.guess_type(full)[0] or "application/octet-stream",
                )
            except ClientError as exc:
                if _is_precondition_failed(exc):
                    return False
                raise
        return True

    def _head(self, full: str) -> dict[str, Any] | None:
        try:
            return self.client.head_object(Bucket=self.bucket, Key=full)
        except ClientError as exc:
            if _is_not_found(exc):
                return None
            raise

    def _remote_sha256(self, full: str) -> str:
        """Download the object (streamed) and hash it: moto and S3-compatible stores may not verify."""
        digest = hashlib.sha256()
        body = self.client.get_object(Bucket=self.bucket, Key=full)["Body"]
        try:
            for chunk in body.iter_chunks(_CHUNK):
                digest.update(chunk)
        finally:
            body.close()
        return digest.hexdigest()

    def _check_existing(self, src: Path, full: str, sha256: str) -> None:
        where = f"s3://{self.bucket}/{full}"
        head = self._head(full)
        if head is None:  # deleted between our write attempt and now: let the caller retry
            raise RuntimeError(f"{where} vanished right after a conditional write found it; retry")
        recorded = (head.get("Metadata") or {}).get("sha256")
        if recorded and recorded != sha256:
            raise _conflict(src, where, recorded, sha256)
        actual = self._remote_sha256(full)
        if actual != sha256:
            raise _conflict(src, where, actual, sha256)

    def _verify_created(self, src: Path, full: str, sha256: str) -> None:
        actual = self._remote_sha256(full)
        if actual != sha256:
            self.client.delete_object(Bucket=self.bucket, Key=full)
            raise PhotoError(
                src, f"verification failed: s3://{self.bucket}/{full} hashed to {actual} after upload, "
                f"expected {sha256}; the object was removed"
            )

    # ----------------------------------------------------------------------------------------- undo

    def stat(self, full: str) -> RemoteObject | None:
        """What is stored under the full key now (one ``HeadObject``), or None when nothing is."""
        with self._errors(Path(full), full):
            head = self._head(full)
        if head is None:
            return None
        return RemoteObject(
            etag=_etag(str(head.get("ETag", ""))),
            size=int(head.get("ContentLength", -1)),
            metadata={str(k).lower(): str(v) for k, v in (head.get("Metadata") or {}).items()},
        )

    def delete_if(self, full: str, etag: str) -> bool:
        """Delete the object under the full key only while its ETag is ``etag`` (``If-Match``, where
        the service honours it: AWS S3, moto); True when it is gone now, False when another object
        is there (412: it changed since). A missing object is gone already (a delete is idempotent)."""
        with self._errors(Path(full), full):
            try:
                self.client.delete_object(Bucket=self.bucket, Key=full, IfMatch=f'"{etag}"')
            except ClientError as exc:
                if _is_precondition_failed(exc):
                    return False
                if not _is_not_found(exc):
                    raise
            return self._head(full) is None

    # ------------------------------------------------------------------------------------- multipart

    def _abort_quietly(self, full: str, upload_id: str | None) -> None:
        if not upload_id:
            return
        try:
            self.client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)
        except ClientError:
            pass

    def _server_parts(self, full: str, upload_id: str) -> dict[int, str] | None:
        """PartNumber → ETag as listed by S3, or None if the upload no longer exists."""
        parts: dict[int, str] = {}
        marker = 0
        while True:
            try:
                page = self.client.list_parts(
                    Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumberMarker=marker
                )
            except ClientError as exc:
                if _error_code(exc) == "NoSuchUpload" or _is_not_found(exc):
                    return None
                raise
            for part in page.get("Parts", []):
                parts[int(part["PartNumber"])] = _etag(part["ETag"])
            if not page.get("IsTruncated"):
                return parts
            marker = int(page["NextPartNumberMarker"])

    def _resume(self, checkpoint: dict[str, Any], full: str, sha256: str, part_size: int) -> dict | None:
        upload_id = checkpoint.get("upload_id")
        if not upload_id:
            return None
        same = (
            checkpoint.get("key") == full
            and checkpoint.get("bucket", self.bucket) == self.bucket
            and checkpoint.get("sha256", sha256) == sha256
            and checkpoint.get("part_size", part_size) == part_size
        )
        if not same:
            if checkpoint.get("key") == full and checkpoint.get("bucket", self.bucket) == self.bucket:
                self._abort_quietly(full, upload_id)  # stale upload of other content for this key
            return None
        listed = self._server_parts(full, upload_id)
        if listed is None:
            return None
        parts = [
            dict(p) for p in checkpoint.get("parts", [])
            if listed.get(int(p["PartNumber"])) == _etag(p["ETag"]) and p.get("sha256")
        ]
        return self._state(full, upload_id, sha256, part_size, parts)

    def _state(self, full: str, upload_id: str, sha256: str, part_size: int, parts: list) -> dict[str, Any]:
        return {"bucket": self.bucket, "key": full, "upload_id": upload_id, "sha256": sha256,
                "part_size": part_size, "parts": parts}

    def _multipart(
        self, src: Path, full: str, meta: dict[str, str], size: int, checkpoint: dict[str, Any],
        save: Callable[[dict[str, Any]], None], part_size: int,
    ) -> bool:
        """Resumable multipart upload; True if we created the object, False if it already existed."""
        sha256 = meta["sha256"]
        if self._head(full) is not None:
            if checkpoint.get("key") == full:
                self._abort_quietly(full, checkpoint.get("upload_id"))
            return False
        state = self._resume(checkpoint, full, sha256, part_size)
        if state is None:
            created = self.client.create_multipart_upload(
                Bucket=self.bucket, Key=full, Metadata=meta, ChecksumAlgorithm="SHA256",
                ContentType=mimetypes.guess_type(full)[0] or "application/octet-stream",
            )
            state = self._state(full, created["UploadId"], sha256, part_size, [])
            save(copy.deepcopy(state))
        upload_id = state["upload_id"]
        done = {int(p["PartNumber"]): p for p in state["parts"]}
        whole = hashlib.sha256()
        count = max(1, math.ceil(size / part_size))
        with open(src, "rb") as fh:
            for number in range(1, count + 1):
                data = fh.read(part_size)
                whole.update(data)
                part_sha = hashlib.sha256(data).hexdigest()
                if done.get(number, {}).get("sha256") == part_sha:
                    continue
                response = self.client.upload_part(
                    Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=data,
                    ChecksumSHA256=_b64(part_sha),
                )
                done[number] = {"PartNumber": number, "ETag": response["ETag"], "sha256": part_sha}
                state["parts"] = [done[n] for n in sorted(done)]
                save(copy.deepcopy(state))
        if whole.hexdigest() != sha256:
            raise PhotoError(src, f"content changed during upload: sha256 is {whole.hexdigest()}, "
                                  f"expected {sha256}")
        parts = [
            {"PartNumber": n, "ETag": done[n]["ETag"], "ChecksumSHA256": _b64(done[n]["sha256"])}
            for n in range(1, count + 1)
        ]
        extra: dict[str, Any] = {}
        if "IfNoneMatch" in self.client.meta.service_model.operation_model(
            "CompleteMultipartUpload"
        ).input_shape.members:
            extra["IfNoneMatch"] = "*"
        try:
            self.client.complete_multipart_upload(
                Bucket=self.bucket, Key=full, UploadId=upload_id, MultipartUpload={"Parts": parts}, **extra
            )
        except ClientError as exc:
            if _is_precondition_failed(exc):
                self._abort_quietly(full, upload_id)
                return False
            if _error_code(exc) == "NoSuchUpload" and self._head(full) is not None:
                return False  # completed by an earlier attempt whose answer was lost
            raise
        return True
