"""The error tree: one root, the documented shape, and the pip line on missing extras."""

from __future__ import annotations

import inspect

import pytest

import vfray.errors as errors


def all_error_classes() -> list[type[BaseException]]:
    return [
        obj
        for obj in vars(errors).values()
        if inspect.isclass(obj) and issubclass(obj, BaseException)
    ]


def test_every_error_is_a_vfray_error() -> None:
    classes = all_error_classes()
    assert len(classes) >= 12
    for cls in classes:
        assert issubclass(cls, errors.VfrayError), cls


def test_every_error_is_drawn_in_the_docstring() -> None:
    doc = errors.__doc__ or ""
    for cls in all_error_classes():
        assert cls.__name__ in doc, cls.__name__


def test_tree_shape() -> None:
    assert issubclass(errors.IncompatibleError, errors.ConfigError)
    for cls in (
        errors.TaskError,
        errors.HarnessError,
        errors.SandboxError,
        errors.ProviderError,
        errors.InterceptionError,
        errors.PhaseTimeoutError,
        errors.InfrastructureError,
    ):
        assert issubclass(cls, errors.RolloutError)
        assert errors.ROLLOUT_ERROR_TYPES[cls.__name__] is cls
    assert not issubclass(errors.ConfigError, errors.RolloutError)
    assert not issubclass(errors.TasksetError, errors.RolloutError)


def test_missing_extra_names_the_pip_line() -> None:
    with pytest.raises(errors.MissingExtraError) as info:
        errors.optional_import("vfray_no_such_module_xyz", "docker")
    message = str(info.value)
    assert "pip install 'vfray[docker]'" in message
    assert "vfray_no_such_module_xyz" in message
    assert isinstance(info.value, ImportError)  # `except ImportError` still catches it
    assert info.value.extra == "docker"


def test_optional_import_returns_the_module_when_present() -> None:
    module = errors.optional_import("json", "dev")
    assert module.__name__ == "json"  # type: ignore[attr-defined]
