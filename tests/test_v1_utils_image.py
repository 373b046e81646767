"""``verifiers.v1.utils.image`` served by vfray's v1 layer: ``image_data_url`` encodes an image as
verifiers 0.4.0's does (PIL's PNG, base64, in a ``data:image/png`` URL), ready for a v1
``ImageUrlContentPart``."""

from __future__ import annotations

import base64
import importlib
import io

import pytest

import vfray.compat.v1 as layer

Image = pytest.importorskip("PIL.Image")


def test_image_data_url_is_the_png_of_the_image() -> None:
    layer.install()
    from verifiers.v1.utils.image import image_data_url  # type: ignore[import-not-found]

    vf = importlib.import_module("verifiers.v1")
    square = Image.new("RGB", (4, 3), (255, 165, 0))
    url = image_data_url(square)
    head, data = url.split(",", 1)
    assert head == "data:image/png;base64"
    back = Image.open(io.BytesIO(base64.b64decode(data)))
    assert back.format == "PNG" and back.size == (4, 3) and back.getpixel((3, 2)) == (255, 165, 0)
    part = vf.ImageUrlContentPart(image_url=vf.ImageUrlSource(url=url))
    assert part.model_dump() == {"type": "image_url", "image_url": {"url": url}}
    with pytest.raises(TypeError, match="needs a PIL image"):
        image_data_url(b"not an image")
