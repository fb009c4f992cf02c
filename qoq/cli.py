"""The `qoq` command: quantize, eval, inspect, recipes, generate, serve. Every command prints a human
rendering, or JSON with --json. Errors are one line (qoq/cli_errors.py); help text conventions:
qoq/cli_help.py."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

import qoq
import qoq.cli_help  # noqa: F401  conventional help text
from qoq.cli_errors import DEBUG_ENV, json_text, one_line_errors, state

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Compile LLMs to W4A8KV4 (QServe/QoQ), measure them, run them.")
recipes_app = typer.Typer(help="List recipes, or show one resolved.", invoke_without_command=True)
app.add_typer(recipes_app, name="recipes")
out = Console(soft_wrap=True)  # piped output: long lines stay whole


def _version(value: bool) -> None:
    if value:
        print(f"qoq {qoq.__version__}")
        raise typer.Exit()


@app.callback()
def main(
    debug: bool = typer.Option(False, "--debug", help=f"show the full stack of an error (or set {DEBUG_ENV}=1)"),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="print the version and exit"),
):
    """Compile LLMs to W4A8KV4 (QServe/QoQ), measure them, run them."""
    state.debug = debug


def _emit(data: dict, as_json: bool, render) -> None:
    if as_json:
        print(json_text(data))
    else:
        render(data)


def _render_quantize(s: dict) -> None:
    gpu = f", {s['device']} peak {s['peak_gpu_mem_gib']:.2f} GiB" if "peak_gpu_mem_gib" in s else ""
    out.print(f"[green]wrote[/green] {s['output']}  ({s['recipe']}, {s['layers']} layers, block rel err "
              f"mean {s['block_rel_err_mean']:.4f} max {s['block_rel_err_max']:.4f}, {s['seconds']:.1f} s, "
              f"peak RSS {s['peak_rss_gib']:.2f} GiB{gpu})", highlight=False)
    from qoq.progress import stderr

    for warning in s.get("warnings", []):
        stderr.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)


@app.command()
@one_line_errors
def quantize(
    model: str = typer.Option(..., metavar="MODEL", help="HF directory, hub id, 'smollm2-135m' (embedded default), or a packaged model: qwen2.5-coder-0.5b, qwen2.5-coder-1.5b"),
    recipe: str = typer.Option("w4a8kv4g128", metavar="RECIPE", help="recipe name (qoq recipes) or path to a .toml"),
    output: Path = typer.Option(..., metavar="DIR", help="artifact directory to create"),
    data_dir: Optional[Path] = typer.Option(None, metavar="DIR", help="local copies of datasets (default: $QOQ_DATA_DIR)"),
    overwrite: bool = typer.Option(False, help="replace an existing qoq artifact (or empty directory) at --output"),
    device: str = typer.Option("cpu", metavar="DEVICE",
                               help="where the passes run, block by block: cpu, cuda or cuda:N (a GPU gives the "
                                    "CPU's results up to float rounding)"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as JSON"),
):
    """Quantize a model with a recipe and write a packed artifact."""
    from qoq.calibration import data_dir as resolve_data_dir
    from qoq.passes.pipeline import quantize_model
    from qoq.recipe import load_recipe

    result = quantize_model(model, load_recipe(recipe), output, data_dir=resolve_data_dir(data_dir),
                            overwrite=overwrite, device=device)
    _emit(result.summary, as_json, _render_quantize)


def _render_eval(r: dict) -> None:
    quantizers = f", quantizers: {','.join(r['quantize']) or 'none'}" if "quantize" in r else ""
    what = (f"{r['model']} ({'artifact, recipe ' + str(r['recipe']) + ', ' if r['artifact'] else ''}{r['backend']}"
            f"{quantizers})")
    if r.get("task") == "wikitext2" and "ppl" in r:
        out.print(f"wikitext2 perplexity {r['ppl']:.4f}  {what}, {r['windows']}/{r['total_windows']} windows of "
                  f"{r['seq_len']} tokens, {r['seconds']:.1f} s", highlight=False)
        return
    out.print(f"{r['task']}  {what}", highlight=False)
    for task, metrics in (r.get("results") or {}).items():
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))
        out.print(f"  {task}: {shown}", highlight=False)


@app.command("eval")
@one_line_errors
def evaluate(
    task: str = typer.Argument(..., help="'wikitext2', or lm-eval task names separated by commas"),
    model: str = typer.Argument(..., help="an artifact directory, or a model (HF dir, hub id, smollm2-135m, qwen2.5-coder-0.5b, ...)"),
    windows: Optional[int] = typer.Option(None, metavar="N", help="wikitext2: evaluate the first N windows only"),
    backend: str = typer.Option(
        "reference", metavar="NAME",
        help="artifact backend: reference (the executor's integer-exact torch model) or cuda (the serving "
             "engine's CUDA runner: fused W4A8 kernels, KV4 pages, chunked prefill; what is served)"),
    device: Optional[str] = typer.Option(
        None, metavar="DEVICE",
        help="where --backend reference or an unquantized model runs: cpu (default), cuda or cuda:N (the same "
             "fp32 torch arithmetic; W4A4 and other formats without kernels evaluate fast on a GPU this way)"),
    seq_len: int = typer.Option(2048, metavar="N", help="wikitext2: window length in tokens (the protocol's 2048)"),
    quantize: str | None = typer.Option(
        None, metavar="LIST",
        help="artifact on --backend reference: run only these quantizers, a comma-separated subset of "
             "weights,activations,kv, or none (default: the artifact's own). Weights cannot be switched: "
             "give them for a W4 artifact, omit them for a W16 one; activations (per-token INT8) switch on "
             "QoQ W4A8 / W16A16 artifacts, kv (UINT4, post-RoPE K and V) on any (docs/design.md §6)"),
    data_dir: Optional[Path] = typer.Option(None, metavar="DIR", help="local copies of datasets (default: $QOQ_DATA_DIR)"),
    limit: Optional[int] = typer.Option(None, metavar="N", help="lm-eval: examples per task"),
    include_path: Optional[Path] = typer.Option(None, metavar="DIR", help="lm-eval: a folder of extra task YAMLs"),
    as_json: bool = typer.Option(False, "--json", help="print the result as JSON"),
):
    """Accuracy of an artifact (exactly what will be served) or of an unquantized model."""
    from qoq.calibration import data_dir as resolve_data_dir
    from qoq.eval.runner import evaluate_task

    result = evaluate_task(task, model, windows=windows, backend=backend, data_dir=resolve_data_dir(data_dir),
                           seq_len=seq_len, limit=limit, include_path=include_path, show_progress=not as_json,
                           quantize=quantize, device=device)
    _emit(result, as_json, _render_eval)


@app.command()
@one_line_errors
def inspect(
    artifact: Path = typer.Argument(..., help="artifact directory"),
    as_json: bool = typer.Option(False, "--json", help="print as JSON"),
):
    """Layers, formats, bytes and compression of an artifact (checksums verified)."""
    from qoq.export.artifact import verify_artifact
    from qoq.export.inspect import inspect_artifact, render_inspect

    verify_artifact(artifact, complete=True)  # schema, version, streamed checksums, every needed tensor
    _emit(inspect_artifact(artifact), as_json, lambda info: render_inspect(info, out))


@recipes_app.callback()
@one_line_errors
def recipes(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="print as JSON")):
    """List the recipes."""
    if ctx.invoked_subcommand:
        return
    from qoq.recipe import load_recipe, recipe_names

    rows = {n: load_recipe(n).description for n in recipe_names()}
    width = max(map(len, rows), default=0)
    _emit(rows, as_json, lambda rows: [out.print(f"[bold]{n:<{width}}[/bold]  {d}", highlight=False)
                                       for n, d in rows.items()])


def _render_recipe(d: dict) -> None:
    out.print(f"[bold]{d['name']}[/bold]  {d['description']}", highlight=False)
    rows = [("source", d["source"]), ("passes", ", ".join(d["passes"]) or "(none)"),
            ("format", "  ".join(f"{k}={v}" for k, v in d["format"].items())),
            *([("transform_format", "  ".join(f"{k}={v}" for k, v in d["transform_format"].items()))]
              if d.get("transform_format") else []),
            ("calibration", "  ".join(f"{k}={v}" for k, v in d["calibration"].items()))]
    rows += [(f"options.{p}", "  ".join(f"{k}={v}" for k, v in o.items())) for p, o in d["pass_options"].items() if o]
    for label, value in rows:
        out.print(f"  {label:<24} {value}", highlight=False)


@recipes_app.command("show")
@one_line_errors
def recipes_show(name: str = typer.Argument(..., help="a recipe name or a path to a .toml"),
                 as_json: bool = typer.Option(False, "--json", help="print as JSON")):
    """Print a recipe with every default filled in."""
    from qoq.recipe import load_recipe

    _emit(load_recipe(name).to_dict(), as_json, _render_recipe)


from qoq.engine.generate_cli import generate as _generate  # noqa: E402  (the engine's command)

app.command("generate")(one_line_errors(_generate))

from qoq.serve.cli import serve as _serve  # noqa: E402  (imports FastAPI only when run)

app.command("serve")(one_line_errors(_serve))


if __name__ == "__main__":
    app()
