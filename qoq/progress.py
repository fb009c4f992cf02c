"""Progress for long work: a rich bar plus one table row per finished step (stderr, so --json stays clean)."""

from __future__ import annotations

from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

stderr = Console(stderr=True)


def rss_gib() -> float:
    """Resident set size of this process now, in GiB (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


def peak_rss_gib() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


class StepProgress:
    """A bar over `total` steps; `row(...)` prints a finished step's figures above the bar."""

    def __init__(self, title: str, total: int, columns: tuple[str, ...], enabled: bool = True):
        self.columns = columns
        self.enabled = enabled
        self._bar = Progress(
            TextColumn(f"[bold]{title}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=stderr, transient=True, disable=not enabled,
        )
        self._task = self._bar.add_task(title, total=total)
        if enabled:
            stderr.print("  ".join(f"[dim]{c:>12}[/dim]" for c in columns))

    def row(self, *values) -> None:
        if self.enabled:
            cells = [f"{v:>12.3e}" if isinstance(v, float) and abs(v) < 1e-2 and v != 0 else
                     f"{v:>12.2f}" if isinstance(v, float) else f"{v!s:>12}" for v in values]
            self._bar.console.print("  ".join(cells))
        self._bar.advance(self._task)

    @contextmanager
    def running(self):
        with self._bar:
            yield self
