"""The `qoq` command: quantize, eval, inspect, recipes, generate, serve. Every command can emit JSON (--json)."""

from __future__ import annotations

import json
import sys
from functools import wraps
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Compile LLMs to W4A8KV4 (QServe/QoQ), measure them, run them.")
recipes_app = typer.Typer(help="List recipes, or show one resolved.", invoke_without_command=True)
app.add_typer(recipes_app, name="recipes")
out = Console()


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by the input (bad recipe, missing model, corrupt artifact): one line, exit 1."""
    from qoq.models.loader import CheckpointError

    return (ValueError, KeyError, OSError, ImportError, CheckpointError)


def one_line_errors(fn):
    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except _user_errors() as e:
            msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
            print(f"error: {msg}", file=sys.stderr)
            raise typer.Exit(1) from None

    return wrapper


def _emit(data: dict, as_json: bool, render) -> None:
    if as_json:
        print(json.dumps(data, indent=2, default=str))
    else:
        render(data)


@app.command()
@one_line_errors
def quantize(
    model: str = typer.Option(..., help="HF directory, hub id, or the embedded default 'smollm2-135m'"),
    recipe: str = typer.Option("w4a8kv4g128", help="recipe name (qoq recipes) or path to a .toml"),
    output: Path = typer.Option(..., help="artifact directory to create"),
    data_dir: Optional[Path] = typer.Option(None, help="local copies of datasets (default: $QOQ_DATA_DIR)"),
    overwrite: bool = typer.Option(False, help="replace an existing output directory"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
):
    """Quantize a model with a recipe and write a packed artifact."""
    from qoq.calibration import data_dir as resolve_data_dir
    from qoq.passes.pipeline import quantize_model
    from qoq.recipe import load_recipe

    result = quantize_model(model, load_recipe(recipe), output, data_dir=resolve_data_dir(data_dir),
                            overwrite=overwrite)
    s = result.summary
    _emit(s, as_json, lambda s: out.print(
        f"[green]wrote[/green] {s['output']}  ({s['recipe']}, {s['layers']} layers, block rel err "
        f"mean {s['block_rel_err_mean']:.4f} max {s['block_rel_err_max']:.4f}, {s['seconds']:.1f} s, "
        f"peak RSS {s['peak_rss_gib']:.2f} GiB)"))


@app.command("eval")
@one_line_errors
def evaluate(
    task: str = typer.Argument(..., help="'wikitext2', or lm-eval task names separated by commas"),
    model: str = typer.Argument(..., help="an artifact directory, or a model (HF dir, hub id, smollm2-135m)"),
    windows: Optional[int] = typer.Option(None, help="wikitext2: evaluate the first N windows only"),
    backend: str = typer.Option("reference", help="artifact executor: reference (torch) or cuda"),
    data_dir: Optional[Path] = typer.Option(None, help="local copies of datasets (default: $QOQ_DATA_DIR)"),
    limit: Optional[int] = typer.Option(None, help="lm-eval: examples per task"),
    include_path: Optional[Path] = typer.Option(None, help="lm-eval: a folder of extra task YAMLs"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
):
    """Accuracy of an artifact (exactly what will be served) or of an unquantized model."""
    from qoq.calibration import data_dir as resolve_data_dir
    from qoq.eval.runner import evaluate_task

    result = evaluate_task(task, model, windows=windows, backend=backend, data_dir=resolve_data_dir(data_dir),
                           limit=limit, include_path=include_path, show_progress=not as_json)
    _emit(result, as_json, lambda r: out.print_json(data={k: v for k, v in r.items() if k != "nll_per_window"}))


@app.command()
@one_line_errors
def inspect(
    artifact: Path = typer.Argument(..., help="artifact directory"),
    as_json: bool = typer.Option(False, "--json", help="print as JSON"),
):
    """Layers, formats, bytes and compression of an artifact (checksums verified)."""
    from qoq.export.artifact import read_artifact
    from qoq.export.inspect import inspect_artifact, render_inspect

    read_artifact(artifact)  # verifies the format version and every tensor's checksum
    _emit(inspect_artifact(artifact), as_json, lambda info: render_inspect(info, out))


@recipes_app.callback()
@one_line_errors
def recipes(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="print as JSON")):
    """List the recipes."""
    if ctx.invoked_subcommand:
        return
    from qoq.recipe import load_recipe, recipe_names

    rows = {n: load_recipe(n).description for n in recipe_names()}
    _emit(rows, as_json, lambda rows: [out.print(f"[bold]{n:<14}[/bold] {d}") for n, d in rows.items()])


@recipes_app.command("show")
@one_line_errors
def recipes_show(name: str, as_json: bool = typer.Option(False, "--json", help="print as JSON")):
    """Print a recipe with every default filled in."""
    from qoq.recipe import load_recipe

    data = load_recipe(name).to_dict()
    _emit(data, as_json, lambda d: out.print_json(data=d))


from qoq.engine.generate_cli import generate as _generate  # noqa: E402  (the engine's command)

app.command("generate")(one_line_errors(_generate))

from qoq.serve.cli import serve as _serve  # noqa: E402  (imports FastAPI only when run)

app.command("serve")(one_line_errors(_serve))


if __name__ == "__main__":
    app()
