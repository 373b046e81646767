"""Image layers untarred as root (vfray.runtimes._image_layers), on images made here layer by
layer, as an OCI layout (gzip blobs) and as a ``docker save`` archive (plain tar members):
whiteouts delete what lower layers have, owners and modes are kept, the config's user is
resolved by the image's own /etc/passwd, and a link a lower layer left leads nowhere on the host
(the layer that writes through it fails, and nothing outside the root is touched)."""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from vfray.errors import SandboxError
from vfray.runtimes._image_flight import ContentFailure
from vfray.runtimes._image_layers import can_untar, docker_archive, oci_layout, unpack
from vfray.runtimes.images import CACHE_ENV, image_config, rootfs

pytestmark = pytest.mark.skipif(not can_untar(), reason="untarring layers needs root, tar, bwrap")

Entry = tuple[str, str, Any]  # (path, kind: file|exe|dir|link, content / link target)


def _layer(entries: list[Entry], owner: int = 0) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for path, kind, content in entries:
            info = tarfile.TarInfo(path)
            info.uid = info.gid = owner
            if kind == "dir":
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            elif kind == "link":
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                data = content.encode()
                info.size, info.mode = len(data), 0o755 if kind == "exe" else 0o640
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


BASE: list[Entry] = [
    ("etc", "dir", None),
    ("etc/passwd", "file", "root:x:0:0::/root:/bin/sh\napp:x:1234:4321::/home/app:/bin/sh\n"),
    ("etc/group", "file", "root:x:0:\napp:x:4321:\n"),
    ("a", "dir", None),
    ("a/x", "file", "x"),
    ("a/y", "file", "y"),
    ("c", "dir", None),
    ("c/old", "dir", None),
    ("c/old/file", "file", "old"),
]
CONFIG = {
    "User": "app",
    "Env": ["PATH=/usr/bin:/bin", "GREETING=hi"],
    "WorkingDir": "/srv",
    "Entrypoint": ["/bin/sh", "-c"],
    "Cmd": ["true"],
}


def _layers(outside: Path) -> list[bytes]:
    return [
        _layer(BASE),
        _layer(
            [
                ("a/.wh.x", "file", ""),  # a/x goes
                ("c/.wh..wh..opq", "file", ""),  # c's lower entries go, its new one stays
                ("c/new", "file", "new"),
                ("srv", "dir", None),
                ("srv/owned", "file", "mine"),
                ("evil", "link", str(outside)),  # a link out of the root...
            ],
            owner=1234,
        ),
        # ...that a later layer writes through, and whites out under.
        _layer([("evil/.wh.keep", "file", ""), ("evil/pwned", "file", "gotcha")]),
    ]


def _blob(layout: Path, data: bytes) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def _zstd(data: bytes) -> bytes:
    return subprocess.run(["zstd", "-q", "-c"], input=data, capture_output=True, check=True).stdout


def _oci(
    layout: Path,
    layers: list[bytes],
    tag: str = "t",
    config: dict[str, Any] = CONFIG,
    compression: str = "gzip",
) -> Path:
    compress = _zstd if compression == "zstd" else gzip.compress
    blobs = [
        {
            "mediaType": f"application/vnd.oci.image.layer.v1.tar+{compression}",
            **_blob(layout, compress(d)),
        }
        for d in layers
    ]
    diff_ids = [f"sha256:{hashlib.sha256(d).hexdigest()}" for d in layers]
    image = {
        "architecture": "amd64",
        "os": "linux",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    described = _blob(layout, json.dumps(image).encode())
    described["mediaType"] = "application/vnd.oci.image.config.v1+json"
    manifest = {"schemaVersion": 2, "config": described, "layers": blobs}
    entry = _blob(layout, json.dumps(manifest).encode())
    entry["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    entry["annotations"] = {"org.opencontainers.image.ref.name": tag}
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [entry]}))
    (layout / "oci-layout").write_text('{"imageLayoutVersion": "1.0.0"}')
    return layout


def _docker_archive(path: Path, layers: list[bytes]) -> Path:
    with tarfile.open(path, "w") as tar:

        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        names = [f"{i}/layer.tar" for i in range(len(layers))]
        for name, data in zip(names, layers, strict=True):
            add(name, data)
        add("img.json", json.dumps({"config": CONFIG}).encode())
        manifest = [{"Config": "img.json", "RepoTags": ["t:1"], "Layers": names}]
        add("manifest.json", json.dumps(manifest).encode())
    return path


def _check_root(root: Path, outside: Path) -> None:
    assert not (root / "a/x").exists() and (root / "a/y").read_text() == "y"
    assert sorted(os.listdir(root / "c")) == ["new"]
    assert not any(p.name.startswith(".wh.") for p in root.rglob("*"))
    owned = (root / "srv/owned").stat()
    assert (owned.st_uid, owned.st_gid, owned.st_mode & 0o777) == (1234, 1234, 0o640)
    assert os.listdir(outside) == ["keep"], "nothing outside the root is written or deleted"


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "keep").write_text("keep")
    return folder


def test_an_oci_layouts_layers_apply_in_order_and_write_nothing_outside(
    tmp_path: Path, outside: Path
) -> None:
    layers = _layers(outside)
    image = oci_layout(_oci(tmp_path / "layout", layers), "t")
    with pytest.raises(ContentFailure, match="layer 3 of 3 did not apply: tar: "):
        unpack(image, tmp_path / "bundle")
    _check_root(tmp_path / "bundle" / "rootfs", outside)
    # Without the layer that writes through the link, the image unpacks whole, with its
    # config resolved: user by the image's own passwd and group, args = entrypoint + cmd.
    good = oci_layout(_oci(tmp_path / "good", layers[:2]), "t")
    root = unpack(good, tmp_path / "good-bundle")
    _check_root(root, outside)
    config = image_config(root)
    assert (config.uid, config.gid, config.workdir) == (1234, 4321, "/srv")
    # HOME (the user's) and TERM added, as umoci adds them where the image sets neither.
    assert config.env == {
        "PATH": "/usr/bin:/bin",
        "GREETING": "hi",
        "TERM": "xterm",
        "HOME": "/home/app",
    }
    assert config.args == ("/bin/sh", "-c", "true")


@pytest.mark.skipif(shutil.which("zstd") is None, reason="the zstd program is not installed")
def test_zstd_layers_apply_too(tmp_path: Path, outside: Path) -> None:
    layout = _oci(tmp_path / "layout", _layers(outside)[:2], compression="zstd")
    root = unpack(oci_layout(layout, "t"), tmp_path / "bundle")
    _check_root(root, outside)


def test_a_docker_archives_layers_are_read_in_place(tmp_path: Path, outside: Path) -> None:
    layers = _layers(outside)[:2]
    archive = _docker_archive(tmp_path / "saved.tar", layers)
    image = docker_archive(archive, "t:1")
    assert [layer.path for layer in image.layers] == [archive, archive]
    root = unpack(image, tmp_path / "bundle")
    _check_root(root, outside)
    assert image_config(root).uid == 1234


def test_an_unknown_user_is_one_line(tmp_path: Path, outside: Path) -> None:
    layers = _layers(outside)[:1]
    layout = _oci(tmp_path / "layout", layers)
    config_path = next(
        p for p in (layout / "blobs/sha256").iterdir() if b'"User": "app"' in p.read_bytes()
    )
    config_path.write_text(json.dumps({"config": {**CONFIG, "User": "nobody-here"}}))
    with pytest.raises(ContentFailure, match="the image's user 'nobody-here' is not in its"):
        unpack(oci_layout(layout, "t"), tmp_path / "bundle")


def test_rootfs_untars_an_oci_layout_once(
    tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "store"))
    shell = _layer([("bin", "dir", None), ("bin/sh", "exe", "#!/bin/true\n")])
    layout = _oci(tmp_path / "layout", [*_layers(outside)[:2], shell])

    async def three() -> list[Path]:
        return list(await asyncio.gather(*(rootfs(f"oci:{layout}:t") for _ in range(3))))

    roots = asyncio.run(three())
    assert len(set(roots)) == 1
    _check_root(roots[0], outside)
    assert image_config(roots[0]).uid == 1234


def _tree(root: Path) -> dict[str, tuple[Any, ...]]:
    found: dict[str, tuple[Any, ...]] = {}
    for path in [root, *root.rglob("*")]:
        info = os.lstat(path)
        link = os.readlink(path) if path.is_symlink() else None
        size = info.st_size if path.is_file() and not path.is_symlink() else None
        found[str(path.relative_to(root))] = (info.st_mode, info.st_uid, info.st_gid, size, link)
    return found


def test_the_tar_way_and_the_umoci_way_give_the_same_root(
    debian_image: Any, tmp_path: Path
) -> None:
    """The Debian base image both ways: every entry with the same type, mode, owner, size and
    link target, and the same config (umoci's way is the one for users other than root)."""
    from vfray.runtimes import _image_rootfs as store
    from vfray.runtimes.images import parse_image

    ref = parse_image(debian_image.oci)
    roots = {}
    for name, way in (("tar", store.untar_image), ("umoci", store.umoci_image)):
        work = tmp_path / name
        work.mkdir()
        way(store.ImageSource(ref), work, work / "bundle")
        roots[name] = work / "bundle" / "rootfs"
    tar, umoci = _tree(roots["tar"]), _tree(roots["umoci"])
    assert len(tar) > 5000
    assert sorted(set(tar) ^ set(umoci)) == []
    assert {k: v for k, v in tar.items() if umoci[k] != v} == {}
    assert image_config(roots["tar"]) == image_config(roots["umoci"])


def test_a_layer_through_an_absolute_link_is_unpacked_by_umoci_inside_the_root(
    tmp_path: Path, outside: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``lib -> /usr/lib`` (absolute) in one layer and ``lib/extra`` in the next: the box's tar
    cannot follow the link inside the image, so the image is unpacked by umoci, which does
    (nothing is written on the host's /usr/lib, nor outside the root)."""
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "store"))
    lower = _layer(
        [
            ("bin", "dir", None),
            ("bin/sh", "exe", "#!/bin/true\n"),
            ("usr", "dir", None),
            ("usr/lib", "dir", None),
            ("lib", "link", "/usr/lib"),
        ]
    )
    upper = _layer([("lib/extra-from-the-image", "file", "extra")])
    layout = _oci(tmp_path / "layout", [lower, upper], config={"Env": ["PATH=/bin"]})
    root = asyncio.run(rootfs(f"oci:{layout}:t"))
    assert (root / "usr/lib/extra-from-the-image").read_text() == "extra"
    assert not Path("/usr/lib/extra-from-the-image").exists()
    assert os.listdir(outside) == ["keep"]
    assert "layer 2 of 2 did not apply" in caplog.text and "with umoci instead" in caplog.text


def test_an_image_neither_way_unpacks_names_both_reasons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "store"))
    layout = _oci(tmp_path / "layout", [b"not a tar"], config={"Env": ["PATH=/bin"]})
    [blob] = [p for p in (layout / "blobs/sha256").iterdir() if p.stat().st_size < 64]
    blob.write_bytes(b"\x1f\x8b" + b"\x00" * 40)  # a gzip header over nothing
    with pytest.raises(SandboxError) as caught:
        asyncio.run(rootfs(f"oci:{layout}:t"))
    message = str(caught.value)
    assert "umoci" in message
    assert "(untarring it failed first: layer 1 of 1 cannot be read: " in message
    assert "\n" not in message
