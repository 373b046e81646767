"""Image references (vfray.runtimes._image_ref): the containers-image transport syntax parsed
once into a frozen record, one ConfigError line for bad syntax, and content keys that follow
what an image is made of."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from vfray.errors import ConfigError, SandboxError
from vfray.runtimes._image_ref import ImageRef, content_key, parse_image

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "reference"),
    [
        ("debian:bookworm", "debian:bookworm"),
        ("python", "python"),
        ("ghcr.io/x/y@" + DIGEST, "ghcr.io/x/y@" + DIGEST),
        ("localhost:5000/team/img:v1.2", "localhost:5000/team/img:v1.2"),
        ("docker://debian:bookworm", "debian:bookworm"),
    ],
)
def test_registry_references(text: str, reference: str) -> None:
    ref = parse_image(text)
    assert ref == ImageRef(transport="docker", reference=reference)
    assert str(ref) == reference


def test_paths_become_absolute_and_keep_their_tag(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert parse_image("oci:layout:v1") == ImageRef(
        transport="oci", path=str(tmp_path / "layout"), reference="v1"
    )
    assert parse_image("oci-archive:/a/b.tar") == ImageRef(transport="oci-archive", path="/a/b.tar")
    archive = parse_image("docker-archive:/a/b.tar:team/img:v1")
    assert (archive.path, archive.reference) == ("/a/b.tar", "team/img:v1")
    assert str(archive) == "docker-archive:/a/b.tar:team/img:v1"


def test_dockerfile_file_or_directory_and_context(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    by_dir = parse_image(f"dockerfile:{tmp_path}")
    assert (by_dir.path, by_dir.context) == (str(tmp_path / "Dockerfile"), str(tmp_path))
    other = parse_image(f"dockerfile:{tmp_path}/Dockerfile:/ctx")
    assert (other.path, other.context) == (str(tmp_path / "Dockerfile"), "/ctx")
    assert parse_image(str(other)) == other  # the record's text parses back to it


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty image reference"),
        ("Debian:Bookworm", "not a valid image reference"),
        ("debian:bad tag", "not a valid image reference"),
        ("dir:/tmp/x", "transport 'dir' is not supported"),
        ("docker-daemon:debian:12", "transport 'docker-daemon' is not supported"),
        ("oci:", "oci: needs a path"),
        ("oci:/x:bad tag!", "is not a valid tag"),
        ("docker-archive:/x.tar:UPPER", "not a valid image reference"),
    ],
)
def test_bad_syntax_is_one_config_error_line(text: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_image(text)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_the_record_is_frozen() -> None:
    with pytest.raises(ValidationError):
        parse_image("debian").reference = "x"  # type: ignore[misc]


def test_missing_paths_are_named(tmp_path: Path) -> None:
    assert parse_image("debian").missing() is None
    ref = parse_image(f"oci-archive:{tmp_path}/none.tar")
    assert f"no such file or directory: {tmp_path}/none.tar" in (ref.missing() or "")
    with pytest.raises(SandboxError, match=r"none\.tar"):
        content_key(ref)


def test_content_keys_follow_content_not_names(tmp_path: Path) -> None:
    one, two = tmp_path / "one.tar", tmp_path / "two.tar"
    one.write_bytes(b"same bytes")
    two.write_bytes(b"same bytes")
    key = content_key(parse_image(f"oci-archive:{one}"))
    assert key == content_key(parse_image(f"oci-archive:{two}"))
    two.write_bytes(b"other bytes")
    assert key != content_key(parse_image(f"oci-archive:{two}"))
    # A docker archive of the same bytes is another kind of image.
    assert key != content_key(parse_image(f"docker-archive:{one}"))


def test_a_dockerfile_key_covers_its_whole_context(tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text("FROM base\nCOPY . /src\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "a.py").write_text("x = 1\n")
    ref = parse_image(f"dockerfile:{tmp_path}")
    first = content_key(ref)
    assert content_key(ref) == first
    (tmp_path / "pkg" / "a.py").write_text("x = 2\n")
    second = content_key(ref)
    assert second != first
    (tmp_path / "pkg" / "a.py").chmod(0o755)
    assert content_key(ref) != second
    with pytest.raises(SandboxError, match="no build context"):
        content_key(parse_image(f"dockerfile:{tmp_path}/Dockerfile:{tmp_path}/nowhere"))
