"""IR schema versions, and the check each component makes at import."""

from importlib import metadata
from pathlib import Path

IR_VERSION = 1
# Every released version stays readable: readers accept any version listed here.
READABLE_VERSIONS = (1,)


class IRVersionError(ImportError):
    """An Ember component needs an IR schema version that the installed ember.ir does not provide."""


def require(component: str, reads: tuple[int, ...], writes: int) -> None:
    """Fail at import, with a clear message, when `component` cannot work with the installed IR."""
    missing = [v for v in reads if v not in READABLE_VERSIONS]
    if writes != IR_VERSION or missing:
        raise IRVersionError(
            f"ember.{component} reads IR versions {list(reads)} and writes version {writes}, but the "
            f"installed ember.ir writes version {IR_VERSION} and reads {list(READABLE_VERSIONS)}. "
            f"Install matching versions: pip install ./ir ./{component} from one checkout."
        )


def component_version(component: str, module_file: str) -> str:
    """A component's own version: its installed distribution's, else its VERSION file's."""
    try:
        return metadata.version(f"ember-{component.replace('_', '-')}")
    except metadata.PackageNotFoundError:
        version_file = Path(module_file).absolute().parents[2] / "VERSION"
        return version_file.read_text().strip() if version_file.exists() else "0+unknown"
