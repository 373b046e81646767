"""``verifiers.v1.utils.image`` as vfray's layer serves it: :func:`image_data_url`, an image as a
base64 PNG data URL, the URL a v1 ``ImageUrlContentPart`` carries (and every interception dialect
records as a chat ``image_url`` part)."""

from __future__ import annotations

import base64
import io
from typing import Any


def image_data_url(image: Any) -> str:
    """``image`` (a PIL image, or anything with PIL's ``save(file, format=...)``) encoded as PNG,
    as a ``data:image/png;base64,...`` URL."""
    save = getattr(image, "save", None)
    if not callable(save):
        raise TypeError(
            f"image_data_url needs a PIL image (an object with save()), got {type(image).__name__}"
        )
    buffer = io.BytesIO()
    save(buffer, format="PNG")
    return f"data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}"
