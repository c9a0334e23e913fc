"""Unit tests for photos.upload against a real moto S3 server (a subprocess on loopback) and a local dir."""

from __future__ import annotations

import hashlib
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from photos.errors import InvalidParameter, OutsideRoot, PatternError, PhotoError
from photos.upload import (
    LocalTarget,
    MiB,
    S3Target,
    UploadTarget,
    object_key,
    parse_target,
)
from tests.support import MotoServer

PART = 5 * MiB


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 server in its own process on 127.0.0.1, polled until it accepts connections."""
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fake credentials from the environment; no region so the us-east-1 default applies."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")


@pytest.fixture
def target(moto_endpoint: str, aws_env: None) -> S3Target:
    """An S3Target on a fresh bucket, built from the environment like production."""
    bucket = f"pj-{uuid.uuid4().hex[:12]}"
    s3 = S3Target(bucket, "backup", endpoint_url=moto_endpoint)
    s3.client.create_bucket(Bucket=bucket)
    return s3


def write(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def stored(s3: S3Target, key: str) -> bytes:
    return s3.client.get_object(Bucket=s3.bucket, Key=s3.full_key(key))["Body"].read()


class CallLog:
    """Records the parameters of every S3 operation of one name sent by a client."""

    def __init__(self, client: Any, operation: str) -> None:
        self.calls: list[dict[str, Any]] = []
        client.meta.events.register(f"provide-client-params.s3.{operation}", self._record)

    def _record(self, params: dict[str, Any], **_: Any) -> None:
        self.calls.append(dict(params))


class Crash(Exception):
    """Simulated worker death while uploading."""


# --------------------------------------------------------------------------------------- parse_target


def test_parse_local_target(tmp_path: Path) -> None:
    assert parse_target(str(tmp_path / "out"), None) == UploadTarget(kind="local", root=tmp_path / "out")


def test_parse_s3_target_with_prefix_and_endpoint() -> None:
    parsed = parse_target("s3://my-photos/backup/2024/", "http://127.0.0.1:9000/")
    assert parsed == UploadTarget(kind="s3", bucket="my-photos", prefix="backup/2024",
                                  endpoint_url="http://127.0.0.1:9000")
    assert parsed.describe() == "s3://my-photos/backup/2024 (endpoint http://127.0.0.1:9000)"
    assert parse_target("s3://my-photos", None).prefix == ""


@pytest.mark.parametrize(
    ("spec", "endpoint", "expected"),
    [
        ("", None, "empty"),
        ("gs://bucket/x", None, "gs:// is not supported"),
        ("s3://", None, "no bucket"),
        ("s3://Bad_Bucket/x", None, "'Bad_Bucket' is not valid"),
        ("s3://ab/x", None, "'ab' is not valid"),
        ("s3://bucket/a/../../x", None, "'..'"),
        ("s3:/bucket/x", None, "s3://bucket/prefix"),
        ("s3://bucket/x", "ftp://host", "'ftp://host' is not valid"),
        ("s3://bucket/x", "http://host:99999", "invalid port"),
        ("/tmp/out", "http://127.0.0.1:9000", "only applies to s3://"),
    ],
)
def test_parse_target_refuses_malformed(spec: str, endpoint: str | None, expected: str) -> None:
    with pytest.raises(InvalidParameter) as caught:
        parse_target(spec, endpoint)
    assert expected in str(caught.value)


def test_parse_target_refuses_a_file_as_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(InvalidParameter, match="not a directory"):
        parse_target(str(tmp_path / "f"), None)


# ----------------------------------------------------------------------------------------- object_key


def test_default_object_key_is_content_addressed() -> None:
    sha = "ab" + "c" * 62
    assert object_key(None, {"sha256": sha}, Path("/p/IMG.JPEG")) == f"ab/{sha}.jpg"


def test_object_key_with_pattern_uses_the_renderer() -> None:
    facts = {"taken": "2024-03-09T14:05:06", "make": "Canon", "model": "EOS R5", "sha256": "d" * 64}
    key = object_key("{taken:%Y/%m}/{camera}_{sha8}{ext}", facts, Path("/p/a.jpg"), file_mtime=0.0)
    assert key == "2024/03/canon-eos-r5_dddddddd.jpg"


def test_object_key_pattern_errors_are_pattern_errors() -> None:
    with pytest.raises(PatternError, match="'..'"):
        object_key("../{stem}", {"sha256": "d" * 64}, Path("/p/a.jpg"), file_mtime=0.0)


def test_object_key_without_sha_names_the_file() -> None:
    with pytest.raises(PhotoError, match="/p/a.jpg"):
        object_key(None, {}, Path("/p/a.jpg"))


# ------------------------------------------------------------------------------------------- S3 small


def test_small_put_uploads_verifies_and_records_sha(target: S3Target, tmp_path: Path) -> None:
    # Given a small photo
    sha = write(tmp_path / "a.jpg", b"jpeg bytes" * 100)
    # When uploaded
    result = target.upload(tmp_path / "a.jpg", "ab/a.jpg", sha)
    # Then it is stored under the prefix, with its sha256 as metadata, and reported as new
    assert result.already_present is False
    assert result.location == f"s3://{target.bucket}/backup/ab/a.jpg"
    assert stored(target, "ab/a.jpg") == b"jpeg bytes" * 100
    head = target.client.head_object(Bucket=target.bucket, Key="backup/ab/a.jpg")
    assert head["Metadata"]["sha256"] == sha
    assert head["ContentType"] == "image/jpeg"
    # and the client used the environment's default region
    assert target.client.meta.region_name == "us-east-1"


def test_repeat_upload_is_a_no_op(target: S3Target, tmp_path: Path) -> None:
    # Given a photo already uploaded
    sha = write(tmp_path / "a.jpg", b"same")
    target.upload(tmp_path / "a.jpg", "a.jpg", sha)
    before = target.client.head_object(Bucket=target.bucket, Key="backup/a.jpg")
    # When the same content is uploaded again (e.g. a retried job)
    puts = CallLog(target.client, "PutObject")
    result = target.upload(tmp_path / "a.jpg", "a.jpg", sha)
    # Then it reports already_present and the object is the same one
    after = target.client.head_object(Bucket=target.bucket, Key="backup/a.jpg")
    assert result.already_present is True and puts.calls == []
    assert after["ETag"] == before["ETag"] and after["LastModified"] == before["LastModified"]


def test_conditional_put_is_used(target: S3Target, tmp_path: Path) -> None:
    puts = CallLog(target.client, "PutObject")
    sha = write(tmp_path / "a.jpg", b"x")
    target.upload(tmp_path / "a.jpg", "a.jpg", sha)
    assert puts.calls[0]["IfNoneMatch"] == "*"
    assert puts.calls[0]["ChecksumSHA256"]


def test_conflicting_content_is_refused(target: S3Target, tmp_path: Path) -> None:
    # Given a key that holds one photo
    first = write(tmp_path / "a.jpg", b"first")
    target.upload(tmp_path / "a.jpg", "a.jpg", first)
    # When different content is uploaded to the same key
    second = write(tmp_path / "b.jpg", b"second")
    with pytest.raises(PhotoError) as caught:
        target.upload(tmp_path / "b.jpg", "a.jpg", second)
    # Then it is refused as a conflict naming the object, and the original is untouched
    assert "conflict" in str(caught.value) and "backup/a.jpg" in str(caught.value)
    assert stored(target, "a.jpg") == b"first"


def test_put_refuses_to_overwrite_an_object_that_appeared(target: S3Target, tmp_path: Path) -> None:
    # Given another writer creating the key after our look but before our put
    sha = write(tmp_path / "a.jpg", b"ours")

    def racer(**_: Any) -> None:
        target.client.meta.events.unregister("before-call.s3.PutObject", racer)
        target.client.put_object(Bucket=target.bucket, Key="backup/a.jpg", Body=b"theirs")

    target.client.meta.events.register("before-call.s3.PutObject", racer)
    # When our conditional put runs / Then it fails with 412, which is reported as a conflict
    with pytest.raises(PhotoError, match="conflict"):
        target.upload(tmp_path / "a.jpg", "a.jpg", sha)
    # and the other writer's object is kept
    assert stored(target, "a.jpg") == b"theirs"


def test_put_race_with_the_same_content_is_already_present(target: S3Target, tmp_path: Path) -> None:
    sha = write(tmp_path / "a.jpg", b"same")

    def racer(**_: Any) -> None:
        target.client.meta.events.unregister("before-call.s3.PutObject", racer)
        target.client.put_object(Bucket=target.bucket, Key="backup/a.jpg", Body=b"same")

    target.client.meta.events.register("before-call.s3.PutObject", racer)
    assert target.upload(tmp_path / "a.jpg", "a.jpg", sha).already_present is True


def test_object_without_sha_metadata_is_compared_by_content(target: S3Target, tmp_path: Path) -> None:
    # Given an object written by another tool (no sha256 metadata) with the same bytes
    target.client.put_object(Bucket=target.bucket, Key="backup/a.jpg", Body=b"same")
    sha = write(tmp_path / "a.jpg", b"same")
    # When uploaded / Then it is recognised as present
    assert target.upload(tmp_path / "a.jpg", "a.jpg", sha).already_present is True


def test_client_side_verification_catches_corruption(target: S3Target, tmp_path: Path) -> None:
    # Given a transport that corrupts the body after the checksum was computed (moto does not check it)
    sha = write(tmp_path / "a.jpg", b"good bytes")

    def corrupt(params: dict[str, Any], **_: Any) -> None:
        params["Body"] = b"evil bytes"

    target.client.meta.events.register("before-parameter-build.s3.PutObject", corrupt)
    # When uploaded
    with pytest.raises(PhotoError) as caught:
        target.upload(tmp_path / "a.jpg", "a.jpg", sha)
    # Then the read-back hash mismatch is reported and the bad object removed
    assert "verification failed" in str(caught.value)
    with pytest.raises(ClientError):
        target.client.head_object(Bucket=target.bucket, Key="backup/a.jpg")
    # and a clean retry succeeds
    target.client.meta.events.unregister("before-parameter-build.s3.PutObject", corrupt)
    assert target.upload(tmp_path / "a.jpg", "a.jpg", sha).already_present is False


def test_wrong_expected_sha_is_refused_before_upload(target: S3Target, tmp_path: Path) -> None:
    write(tmp_path / "a.jpg", b"bytes")
    with pytest.raises(PhotoError, match="content changed since analysis"):
        target.upload(tmp_path / "a.jpg", "a.jpg", "0" * 64)


def test_missing_source_names_the_file(target: S3Target, tmp_path: Path) -> None:
    with pytest.raises(PhotoError) as caught:
        target.upload(tmp_path / "nope.jpg", "a.jpg", "0" * 64)
    assert str(tmp_path / "nope.jpg") in str(caught.value) and "missing" in str(caught.value)


def test_unreachable_endpoint_names_the_endpoint(aws_env: None, tmp_path: Path) -> None:
    # Given an endpoint where nothing listens
    endpoint = f"http://127.0.0.1:{_free_port()}"
    s3 = S3Target("some-bucket", "", endpoint_url=endpoint, max_attempts=1)
    sha = write(tmp_path / "a.jpg", b"x")
    # When uploading / Then the error names the endpoint
    with pytest.raises(PhotoError) as caught:
        s3.upload(tmp_path / "a.jpg", "a.jpg", sha)
    assert endpoint in str(caught.value) and "cannot reach" in str(caught.value)


def test_missing_bucket_names_the_bucket(moto_endpoint: str, aws_env: None, tmp_path: Path) -> None:
    s3 = S3Target("no-such-bucket-here", "", endpoint_url=moto_endpoint)
    sha = write(tmp_path / "a.jpg", b"x")
    with pytest.raises(PhotoError, match="'no-such-bucket-here' does not exist"):
        s3.upload(tmp_path / "a.jpg", "a.jpg", sha)


def test_part_size_below_minimum_is_refused(target: S3Target, tmp_path: Path) -> None:
    sha = write(tmp_path / "a.jpg", b"x")
    with pytest.raises(InvalidParameter, match="part_size"):
        target.upload(tmp_path / "a.jpg", "a.jpg", sha, part_size=1024)


# ------------------------------------------------------------------------------------------ multipart


@pytest.fixture
def big(tmp_path: Path) -> tuple[Path, str]:
    """A 3.5-part file (4 parts of 5 MiB, the last one short)."""
    path = tmp_path / "big.tif"
    return path, write(path, os.urandom(3 * PART + 123_457))


def _crash_after(parts: int, saved: list[dict[str, Any]]) -> Callable[[dict[str, Any]], None]:
    def save(state: dict[str, Any]) -> None:
        saved.append(state)
        if len(state["parts"]) >= parts:
            raise Crash(f"worker died after {parts} parts")

    return save


def test_multipart_upload_and_repeat(target: S3Target, big: tuple[Path, str]) -> None:
    path, sha = big
    saved: list[dict[str, Any]] = []
    # When a large file is uploaded
    result = target.upload(path, "big.tif", sha, {}, saved.append, multipart_threshold=PART, part_size=PART)
    # Then it is stored whole, with checkpoints after the create and each of the 4 parts
    assert result.already_present is False
    assert stored(target, "big.tif") == path.read_bytes()
    assert [len(state["parts"]) for state in saved] == [0, 1, 2, 3, 4]
    assert saved[-1]["key"] == "backup/big.tif" and saved[-1]["upload_id"]
    assert {"PartNumber", "ETag", "sha256"} <= set(saved[-1]["parts"][0])
    assert target.client.head_object(Bucket=target.bucket, Key="backup/big.tif")["Metadata"]["sha256"] == sha
    # When uploaded again / Then nothing is sent and it is already present
    parts = CallLog(target.client, "UploadPart")
    again = target.upload(path, "big.tif", sha, saved[-1], saved.append, multipart_threshold=PART,
                          part_size=PART)
    assert again.already_present is True and parts.calls == []


def test_multipart_resume_skips_uploaded_parts(target: S3Target, big: tuple[Path, str]) -> None:
    path, sha = big
    saved: list[dict[str, Any]] = []
    # Given an upload that died after 2 of 4 parts were uploaded and checkpointed
    with pytest.raises(Crash):
        target.upload(path, "big.tif", sha, {}, _crash_after(2, saved), multipart_threshold=PART,
                      part_size=PART)
    checkpoint = saved[-1]
    assert [p["PartNumber"] for p in checkpoint["parts"]] == [1, 2]
    # When resumed with that checkpoint, counting the parts actually sent
    parts = CallLog(target.client, "UploadPart")
    lists = CallLog(target.client, "ListParts")
    result = target.upload(path, "big.tif", sha, checkpoint, saved.append, multipart_threshold=PART,
                           part_size=PART)
    # Then only parts 3 and 4 are sent, the server's part list was consulted, and the object is whole
    assert [call["PartNumber"] for call in parts.calls] == [3, 4]
    assert all(call["UploadId"] == checkpoint["upload_id"] for call in parts.calls)
    assert len(lists.calls) >= 1
    assert result.already_present is False
    assert stored(target, "big.tif") == path.read_bytes()
    uploads = target.client.list_multipart_uploads(Bucket=target.bucket).get("Uploads", [])
    assert uploads == []


def test_multipart_resume_resends_parts_the_server_lacks(target: S3Target, big: tuple[Path, str]) -> None:
    path, sha = big
    saved: list[dict[str, Any]] = []
    with pytest.raises(Crash):
        target.upload(path, "big.tif", sha, {}, _crash_after(2, saved), multipart_threshold=PART,
                      part_size=PART)
    # Given a checkpoint whose part 1 ETag does not match what ListParts reports
    checkpoint = saved[-1]
    checkpoint["parts"][0]["ETag"] = '"00000000000000000000000000000000"'
    # When resumed
    parts = CallLog(target.client, "UploadPart")
    target.upload(path, "big.tif", sha, checkpoint, saved.append, multipart_threshold=PART, part_size=PART)
    # Then part 1 is sent again along with the missing ones, and the result is correct
    assert [call["PartNumber"] for call in parts.calls] == [1, 3, 4]
    assert stored(target, "big.tif") == path.read_bytes()


def test_multipart_resume_after_aborted_upload_starts_again(target: S3Target, big: tuple[Path, str]) -> None:
    path, sha = big
    saved: list[dict[str, Any]] = []
    with pytest.raises(Crash):
        target.upload(path, "big.tif", sha, {}, _crash_after(1, saved), multipart_threshold=PART,
                      part_size=PART)
    # Given the checkpointed upload was aborted meanwhile (e.g. a bucket lifecycle rule)
    checkpoint = saved[-1]
    target.client.abort_multipart_upload(Bucket=target.bucket, Key="backup/big.tif",
                                         UploadId=checkpoint["upload_id"])
    # When resumed
    parts = CallLog(target.client, "UploadPart")
    target.upload(path, "big.tif", sha, checkpoint, saved.append, multipart_threshold=PART, part_size=PART)
    # Then a new upload sends all 4 parts and completes
    assert [call["PartNumber"] for call in parts.calls] == [1, 2, 3, 4]
    assert parts.calls[0]["UploadId"] != checkpoint["upload_id"]
    assert stored(target, "big.tif") == path.read_bytes()


def test_multipart_conflict_is_refused(target: S3Target, big: tuple[Path, str], tmp_path: Path) -> None:
    path, sha = big
    other = write(tmp_path / "other.tif", b"other")
    target.upload(tmp_path / "other.tif", "big.tif", other)
    parts = CallLog(target.client, "UploadPart")
    with pytest.raises(PhotoError, match="conflict"):
        target.upload(path, "big.tif", sha, {}, None, multipart_threshold=PART, part_size=PART)
    assert parts.calls == []
    assert stored(target, "big.tif") == b"other"


def test_multipart_complete_refuses_to_overwrite_an_object_that_appeared(target: S3Target,
                                                                         big: tuple[Path, str]) -> None:
    # Given another writer creating the key while our parts are uploading
    path, sha = big
    saved: list[dict[str, Any]] = []
    with pytest.raises(Crash):
        target.upload(path, "big.tif", sha, {}, _crash_after(4, saved), multipart_threshold=PART,
                      part_size=PART)
    checkpoint = saved[-1]

    def racer(**_: Any) -> None:
        target.client.meta.events.unregister("before-call.s3.CompleteMultipartUpload", racer)
        target.client.put_object(Bucket=target.bucket, Key="backup/big.tif", Body=b"racer")

    target.client.meta.events.register("before-call.s3.CompleteMultipartUpload", racer)
    # When our upload completes
    with pytest.raises(PhotoError, match="conflict"):
        target.upload(path, "big.tif", sha, checkpoint, None, multipart_threshold=PART, part_size=PART)
    # Then the racer's object is kept (If-None-Match on complete) and our upload was aborted
    assert stored(target, "big.tif") == b"racer"
    assert target.client.list_multipart_uploads(Bucket=target.bucket).get("Uploads", []) == []


def test_multipart_verification_catches_a_corrupted_part(target: S3Target, big: tuple[Path, str]) -> None:
    path, sha = big

    def corrupt(params: dict[str, Any], **_: Any) -> None:
        if params["PartNumber"] == 2:
            params["Body"] = bytes(len(params["Body"]))

    target.client.meta.events.register("before-parameter-build.s3.UploadPart", corrupt)
    with pytest.raises(PhotoError, match="verification failed"):
        target.upload(path, "big.tif", sha, {}, None, multipart_threshold=PART, part_size=PART)


# ---------------------------------------------------------------------------------------------- local


def test_local_upload_is_atomic_and_no_clobber(tmp_path: Path) -> None:
    # Given a local target and a photo
    root = tmp_path / "backup"
    local = LocalTarget(root)
    sha = write(tmp_path / "a.jpg", b"photo")
    os.utime(tmp_path / "a.jpg", (1_600_000_000, 1_600_000_000))
    # When uploaded
    result = local.upload(tmp_path / "a.jpg", "ab/a.jpg", sha, stage_tag="job1")
    # Then the file is at the planned destination, mtime kept, and no staged temp is left
    dest = local.destination("ab/a.jpg")
    assert result.location == str(dest) and result.already_present is False
    assert dest.read_bytes() == b"photo" and dest.stat().st_mtime == 1_600_000_000
    assert sorted(p.name for p in dest.parent.iterdir()) == ["a.jpg"]
    # When uploaded again / Then it is a no-op
    assert local.upload(tmp_path / "a.jpg", "ab/a.jpg", sha, stage_tag="job2").already_present is True


def test_local_conflict_is_refused_and_keeps_the_original(tmp_path: Path) -> None:
    local = LocalTarget(tmp_path / "backup")
    write(tmp_path / "a.jpg", b"first")
    local.upload(tmp_path / "a.jpg", "a.jpg", hashlib.sha256(b"first").hexdigest(), "t1")
    sha = write(tmp_path / "b.jpg", b"second")
    with pytest.raises(PhotoError, match="conflict"):
        local.upload(tmp_path / "b.jpg", "a.jpg", sha, "t2")
    assert local.destination("a.jpg").read_bytes() == b"first"


def test_local_publish_loses_the_race_without_overwriting(tmp_path: Path) -> None:
    # Given a staged copy, and another writer creating the destination before we publish
    local = LocalTarget(tmp_path / "backup")
    sha = write(tmp_path / "a.jpg", b"ours")
    staged = local.stage(tmp_path / "a.jpg", "a.jpg", sha, "t1")
    assert staged.name == ".a.jpg.pj-t1.tmp" and staged.read_bytes() == b"ours"
    local.destination("a.jpg").write_bytes(b"theirs")
    # When publishing / Then it is a conflict and theirs is kept
    with pytest.raises(PhotoError, match="conflict"):
        local.publish(staged, "a.jpg", sha)
    assert local.destination("a.jpg").read_bytes() == b"theirs"


def test_local_publish_is_idempotent(tmp_path: Path) -> None:
    # Given a staged copy that was published (the worker died before marking it applied)
    local = LocalTarget(tmp_path / "backup")
    sha = write(tmp_path / "a.jpg", b"ours")
    staged = local.stage(tmp_path / "a.jpg", "a.jpg", sha, "t1")
    assert local.publish(staged, "a.jpg", sha).already_present is False
    assert not staged.exists()
    # When the recorded intent is applied again / Then it reports the content as present
    assert local.publish(staged, "a.jpg", sha).already_present is True


def test_local_stage_refuses_changed_content(tmp_path: Path) -> None:
    local = LocalTarget(tmp_path / "backup")
    write(tmp_path / "a.jpg", b"changed")
    with pytest.raises(PhotoError, match="content changed"):
        local.stage(tmp_path / "a.jpg", "a.jpg", "0" * 64, "t1")
    assert list((tmp_path / "backup").iterdir()) == []


def test_local_missing_source_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(PhotoError, match="nope.jpg"):
        LocalTarget(tmp_path).upload(tmp_path / "nope.jpg", "a.jpg", "0" * 64, "t1")


def test_local_destination_outside_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "backup"
    root.mkdir()
    os.symlink(tmp_path, root / "up")
    with pytest.raises(OutsideRoot):
        LocalTarget(root).destination("up/x.jpg")
    with pytest.raises(InvalidParameter):
        LocalTarget(root).destination("../x.jpg")


def test_local_bad_stage_tag_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameter, match="stage tag"):
        LocalTarget(tmp_path).staged_path("a.jpg", "../x")


# ------------------------------------------------------------------------------------ S3 undo (#31)


@pytest.mark.parametrize("threshold", [1 << 30, 0], ids=["put", "multipart"])
def test_an_upload_carries_its_uploader_and_is_deleted_only_while_its_etag_holds(
    target: S3Target, tmp_path: Path, threshold: int
) -> None:
    # Given a photo uploaded with its uploader's metadata (single put, or multipart)
    sha = write(tmp_path / "a.jpg", b"photo" * 50)
    mine = {"photojobs-job": "4", "photojobs-item": "17"}
    target.upload(tmp_path / "a.jpg", "a.jpg", sha, metadata=mine, multipart_threshold=threshold)
    # Then stat reports its ETag, size and metadata (the uploader and the content hash)
    found = target.stat("backup/a.jpg")
    assert found is not None and found.size == 250
    assert found.metadata == {**mine, "sha256": sha}
    # When it is replaced by other bytes, a delete conditioned on the old ETag deletes nothing
    target.client.put_object(Bucket=target.bucket, Key="backup/a.jpg", Body=b"other")
    assert target.delete_if("backup/a.jpg", found.etag) is False
    assert stored(target, "a.jpg") == b"other"
    # and one on the current ETag deletes it; a second delete finds it gone (idempotent)
    now = target.stat("backup/a.jpg")
    assert now is not None and target.delete_if("backup/a.jpg", now.etag) is True
    assert target.stat("backup/a.jpg") is None and target.delete_if("backup/a.jpg", now.etag) is True
