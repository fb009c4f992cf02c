"""SGLang's own QoQ loading code, run on the CPU from the installed sglang wheel (docs/serve.md, "Running the
artifact in SGLang").

SGLang 0.5.15.post1 is the last release with the `qoq` quantization method (later releases removed it).
`import sglang.srt.layers.quantization.qoq` cannot run here: the package's __init__ chain needs triton, the
CUDA kernels and the server stack. So this module parses the wheel's source files with `ast` and executes
SGLang's definitions unchanged, with every `from sglang... import` left out and each name such an import gave
bound to SGLang's own definition of it, executed the same way (or left undefined where the loading path
never reaches it, so reaching one fails loudly):

- whole files: quantization/qoq.py (QoQConfig, QoQLinearMethod), quantization/base_config.py,
  layers/parameter.py, layers/linear.py, kernel_api_logging.py;
- single functions of files that import far more: divide and ensure_divisibility (distributed/utils.py),
  set_weight_attrs (utils/common.py), get_layer_id and pad_or_narrow_weight (layers/utils/common.py),
  default_weight_loader and maybe_remap_kv_scale_name (model_loader/weight_utils.py), and
  LlamaForCausalLM.load_weights / Qwen2ForCausalLM.load_weights.

What is ours: `_is_cpu = _is_cuda = _is_hip = _is_npu = False` (the loaders' GPU branches, what a deployment
runs; _is_cuda False only skips importing the GEMM kernels, which loading never calls), and `model_skeleton`,
the module tree of SGLang's LlamaModel with SGLang's real linear layers and plain fp16 parameters for the
embeddings, norms and lm_head (SGLang loads those like any fp16 checkpoint). LinearBase's constructor asks
QoQConfig.get_quant_method, which imports `sglang.srt.layers.linear`; while layers are built that name is
bound in sys.modules to the linear.py code executed here.
"""

import __future__

import ast
import contextlib
import importlib.metadata
import importlib.util
import logging
import sys
import types
from pathlib import Path

import torch

SGLANG_VERSION = "0.5.15.post1"
INSTALL = f"pip install --no-deps sglang=={SGLANG_VERSION}"
GPU_BRANCH = {"_is_cpu": False, "_is_cuda": False, "_is_hip": False, "_is_npu": False,
              "_disable_hip_linear_quant": False}
LOAD_WEIGHTS = {"LlamaForCausalLM": "srt/models/llama.py", "Qwen2ForCausalLM": "srt/models/qwen2.py"}


class SGLangSourceError(RuntimeError):
    """The installed sglang does not hold a definition this check executes."""


def unavailable() -> str | None:
    """Why the check cannot run here, or None."""
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return f"sglang is not installed: {INSTALL} (scripts/setup.sh does)"
    if version != SGLANG_VERSION:
        return f"sglang {version} is installed; this check reads {SGLANG_VERSION}, the last release with qoq"
    return None


def _root() -> Path:
    spec = importlib.util.find_spec("sglang")  # locates the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise SGLangSourceError("sglang is not importable from sys.path")
    return Path(list(spec.submodule_search_locations)[0])


def _compile(nodes: list[ast.stmt], path: Path):
    module = ast.Module(body=nodes, type_ignores=[])
    # annotations stay strings (as in the files that say `from __future__ import annotations`)
    return compile(module, str(path), "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)


def _is_sglang_import(node: ast.stmt) -> bool:
    if isinstance(node, ast.ImportFrom):
        return (node.module or "").split(".")[0] in ("sglang", "sgl_kernel")
    return isinstance(node, ast.Import) and any(a.name.split(".")[0] == "sglang" for a in node.names)


def _assigned(node: ast.stmt) -> str | None:
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    return None


class SGLangCode:
    """SGLang's QoQ loading path, executed from the source of the installed wheel."""

    def __init__(self):
        reason = unavailable()
        if reason:
            raise SGLangSourceError(reason)
        self.root = _root()
        base = self._module("srt/layers/quantization/base_config.py", {})
        utils = self._functions("srt/layers/utils/common.py", ["get_layer_id", "pad_or_narrow_weight"])
        param = self._module("srt/layers/parameter.py", utils)
        qoq = self._module("srt/layers/quantization/qoq.py", {**param, **base})
        self.QoQConfig, self.QoQLinearMethod = qoq["QoQConfig"], qoq["QoQLinearMethod"]
        self.supported_group_sizes = qoq["QoQ_SUPPORTED_GROUP_SIZES"]
        self.linear = self._module("srt/layers/linear.py", {
            **param, **utils, **self._module("kernel_api_logging.py", {}),
            **self._functions("srt/distributed/utils.py", ["divide", "ensure_divisibility"]),
            **self._functions("srt/utils/common.py", ["set_weight_attrs"])})
        loaders = self._functions("srt/model_loader/weight_utils.py",
                                  ["default_weight_loader", "maybe_remap_kv_scale_name"])
        self.default_weight_loader = loaders["default_weight_loader"]
        self.load_log = logging.getLogger("sglang_check.load_weights")
        model_globals = {**loaders, "get_layer_id": utils["get_layer_id"], "logger": self.load_log, "torch": torch}
        self.load_weights = {arch: self._method(path, arch, "load_weights", model_globals)
                             for arch, path in LOAD_WEIGHTS.items()}

    def _path(self, rel: str) -> Path:
        path = self.root / rel
        if not path.is_file():
            raise SGLangSourceError(f"{path} not found: is this sglang {SGLANG_VERSION}?")
        return path

    def _module(self, rel: str, pool: dict) -> dict:
        """Run a whole file but its sglang imports; each name such an import gives is bound from `pool`
        (SGLang's own definitions executed before), or stays undefined."""
        path = self._path(rel)
        ns = {"__name__": f"sglang_check.{rel}", "__file__": str(path), **GPU_BRANCH}
        nodes = []
        for node in ast.parse(path.read_text(), str(path)).body:
            if _is_sglang_import(node):
                ns.update({a.asname or a.name: pool[a.name] for a in getattr(node, "names", ()) if a.name in pool})
            elif _assigned(node) not in GPU_BRANCH:
                nodes.append(node)
        exec(_compile(nodes, path), ns)
        return ns

    def _functions(self, rel: str, names: list[str]) -> dict:
        """Only the named top-level functions of a file (their modules import far more than they use)."""
        path = self._path(rel)
        found = {n.name: n for n in ast.parse(path.read_text(), str(path)).body if isinstance(n, ast.FunctionDef)}
        missing = [name for name in names if name not in found]
        if missing:
            raise SGLangSourceError(f"{path} defines no function {missing[0]}")
        ns = {"__name__": f"sglang_check.{rel}"}
        exec(_compile([ast.parse("import re, torch").body[0], *(found[n] for n in names)], path), ns)
        return {name: ns[name] for name in names}

    def _method(self, rel: str, cls: str, name: str, globals_: dict):
        path = self._path(rel)
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef) and node.name == cls:
                fns = [f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == name]
                if fns:
                    local: dict = {}
                    exec(_compile(fns, path), {"__name__": f"sglang_check.{rel}", **globals_}, local)
                    return local[name]
        raise SGLangSourceError(f"{path} defines no {cls}.{name}")

    def _tree(self, rel: str) -> ast.Module:
        path = self._path(rel)
        return ast.parse(path.read_text(), str(path))

    def quantization_methods(self) -> list[str]:
        """The keys of BASE_QUANTIZATION_METHODS (quantization/__init__.py): the names --quantization and
        config.json's quant_method may take."""
        for node in ast.walk(self._tree("srt/layers/quantization/__init__.py")):
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "BASE_QUANTIZATION_METHODS":
                return [ast.literal_eval(k) for k in node.value.keys]
        raise SGLangSourceError("quantization/__init__.py assigns no BASE_QUANTIZATION_METHODS")

    def kv_cache_dtypes(self) -> list[str]:
        """The choices of ServerArgs.kv_cache_dtype (--kv-cache-dtype)."""
        for node in ast.walk(self._tree("srt/server_args.py")):
            if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "kv_cache_dtype":
                for sub in ast.walk(node.annotation):
                    if isinstance(sub, ast.keyword) and sub.arg == "choices":
                        return ast.literal_eval(sub.value)
        raise SGLangSourceError("server_args.py declares no kv_cache_dtype choices")

    @contextlib.contextmanager
    def _linear_module(self):
        name = "sglang.srt.layers.linear"
        module = types.ModuleType(name)
        module.__dict__.update({k: v for k, v in self.linear.items() if not k.startswith("__")})
        saved = sys.modules.get(name)
        sys.modules[name] = module
        try:
            yield
        finally:
            if saved is None:
                del sys.modules[name]
            else:
                sys.modules[name] = saved

    def model_skeleton(self, config: dict, tp_rank: int = 0, tp_size: int = 1) -> torch.nn.Module:
        """SGLang's module tree for a Llama / Qwen2 config.json (parameter names as LlamaModel's), its linears
        SGLang's own layers built with QoQConfig.from_config(config["quantization_config"]), as
        LlamaAttention / LlamaMLP / Qwen2Attention / Qwen2MLP build them."""
        arch = config["architectures"][0]
        if arch not in LOAD_WEIGHTS:
            raise SGLangSourceError(f"no SGLang model class mapped for {arch}")
        quant = self.QoQConfig.from_config(config["quantization_config"])
        h, inter, heads = config["hidden_size"], config["intermediate_size"], config["num_attention_heads"]
        kv_heads, d = config.get("num_key_value_heads", heads), config.get("head_dim") or h // heads
        qkv_bias = arch == "Qwen2ForCausalLM" or bool(config.get("attention_bias", False))
        o_bias = arch != "Qwen2ForCausalLM" and qkv_bias
        lin, tp = self.linear, {"tp_rank": tp_rank, "tp_size": tp_size, "quant_config": quant,
                                "params_dtype": torch.float16}

        def fp16(*shape: int) -> torch.nn.Module:  # an embedding, norm or lm_head: one fp16 `weight`
            module = torch.nn.Module()
            module.weight = torch.nn.Parameter(torch.empty(*shape, dtype=torch.float16), requires_grad=False)
            return module

        root, model = torch.nn.Module(), torch.nn.Module()
        root.model, root.config = model, types.SimpleNamespace(**{"tie_word_embeddings": False, **config})
        model.embed_tokens, model.norm, model.layers = fp16(config["vocab_size"], h), fp16(h), torch.nn.ModuleList()
        with self._linear_module():
            for i in range(config["num_hidden_layers"]):
                p, layer = f"model.layers.{i}", torch.nn.Module()
                layer.self_attn, layer.mlp = torch.nn.Module(), torch.nn.Module()
                layer.self_attn.qkv_proj = lin["QKVParallelLinear"](
                    h, d, heads, kv_heads, bias=qkv_bias, prefix=f"{p}.self_attn.qkv_proj", **tp)
                layer.self_attn.o_proj = lin["RowParallelLinear"](
                    heads * d, h, bias=o_bias, prefix=f"{p}.self_attn.o_proj", **tp)
                layer.mlp.gate_up_proj = lin["MergedColumnParallelLinear"](
                    h, [inter] * 2, bias=False, prefix=f"{p}.mlp.gate_up_proj", **tp)
                layer.mlp.down_proj = lin["RowParallelLinear"](inter, h, bias=False, prefix=f"{p}.mlp.down_proj", **tp)
                layer.input_layernorm, layer.post_attention_layernorm = fp16(h), fp16(h)
                model.layers.append(layer)
        root.lm_head = model.embed_tokens if root.config.tie_word_embeddings else fp16(config["vocab_size"], h)
        return root

    def load(self, skeleton: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
        """SGLang's load_weights of the config's architecture over (name, tensor) pairs, then each
        linear's process_weights_after_loading."""
        self.load_weights[skeleton.config.architectures[0]](skeleton, iter(tensors.items()))
        for module in skeleton.modules():
            if isinstance(module, self.linear["LinearBase"]):
                module.quant_method.process_weights_after_loading(module)
