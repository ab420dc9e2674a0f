"""Options shared by subcommands: which model, which device, which Ray cluster."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from tl_reward.data.hh_rlhf import pair_from_dialogues
from tl_reward.data.preference import PreferencePair
from tl_reward.errors import EmptyResponseError, TLRewardError
from tl_reward.model.demo import DEMO_MODEL_NAME


def add_device_options(parser: argparse.ArgumentParser) -> None:
    """``--device``, ``--threads``, ``--trust-remote-code``."""
    parser.add_argument("--device", default=None, help="cpu, cuda, ... (default: cuda if present)")
    parser.add_argument("--threads", type=int,
                        help="torch CPU threads (default: torch's; on a loaded machine 1 can be "
                             "many times faster than 2)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow custom modeling code (ArmoRM)")


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """``--model``, ``--backend`` and the device options."""
    parser.add_argument("--model", default=DEMO_MODEL_NAME,
                        help=f"hub name, local directory or built-in name (default: the demo RM "
                             f"{DEMO_MODEL_NAME})")
    parser.add_argument("--backend", choices=["auto", "hooked", "bridge"], default="auto",
                        help="hooked: HookedRewardModel (TransformerLens 3); bridge: "
                             "BridgeRewardModel (TransformerLens's TransformerBridge, HF's own "
                             "forward; the only one under TransformerLens 4); auto (default): "
                             "hooked where HookedTransformer exists, else bridge")
    parser.add_argument("--step-tag", help="read a reward at each step's TAG (a process reward "
                        "model; Qwen2.5-Math-PRM and the demo PRM know theirs)")
    parser.add_argument("--head-weights", help="combine the head's outputs into the reward, "
                        "e.g. --head-weights=-1,1 (a two-class PRM head: class 1 minus class 0)")
    add_device_options(parser)


def add_step_option(parser: argparse.ArgumentParser, what: str = "the analysis") -> None:
    """``--step`` of a process reward model: an index, a comma list, ``all`` or ``last``."""
    parser.add_argument("--step", type=parse_step, default=None,
                        help=f"a process reward model's step(s) {what} reads: an index (negative "
                             "from the end), a comma list such as 0,2, 'all' or 'last'")


def parse_step(text: str) -> Any:
    """``--step``'s value: ``"all"``, ``"last"``, an int, or a list of ints."""
    if text in ("all", "last"):
        return text
    try:
        items = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--step {text!r}: pass an index, a comma list of indices, 'all' or 'last'") from None
    return items[0] if len(items) == 1 else items


def apply_threads(args: argparse.Namespace) -> None:
    """Set torch's CPU thread count from ``--threads`` (this process only runs the command)
    and check that ``--device`` names a device this machine has."""
    import torch

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    device = getattr(args, "device", None)
    if device in (None, "auto"):
        return
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise TLRewardError(f"--device {device!r} is not a torch device (cpu, cuda, cuda:1, "
                            "mps)") from exc
    if dev.type == "cuda" and (not torch.cuda.is_available()
                               or (dev.index or 0) >= torch.cuda.device_count()):
        raise TLRewardError(f"--device {device}: this machine has "
                            f"{torch.cuda.device_count() if torch.cuda.is_available() else 'no'} "
                            "CUDA GPU(s) torch can use; pass --device cpu (or leave it out)")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise TLRewardError(f"--device {device}: MPS is not available here; pass --device cpu")


def load_model(args: argparse.Namespace, name: str | None = None) -> Any:
    """The reward model the options name (``name`` overrides ``--model``), on ``--backend``."""
    apply_threads(args)
    backend = getattr(args, "backend", "auto")
    if backend == "auto":
        try:
            from transformer_lens import HookedTransformer  # noqa: F401
        except ImportError:  # TransformerLens 4 removed it
            backend = "bridge"
    if backend == "bridge":
        from tl_reward.model.bridge_reward_model import BridgeRewardModel

        model = BridgeRewardModel.from_pretrained(name or args.model, device=args.device,
                                                  trust_remote_code=args.trust_remote_code)
    else:
        from tl_reward import HookedRewardModel

        model = HookedRewardModel.from_pretrained(name or args.model, device=args.device,
                                                  trust_remote_code=args.trust_remote_code)
    tag, weights = getattr(args, "step_tag", None), getattr(args, "head_weights", None)
    if tag is not None or weights is not None:
        try:
            w = None if weights is None else [float(x) for x in weights.split(",")]
        except ValueError:
            raise TLRewardError(f"--head-weights {weights!r}: pass numbers separated by "
                                "commas, e.g. -1,1") from None
        model.use_steps(tag, w)
    if getattr(args, "step", None) is not None and model.step_format is None:
        raise TLRewardError(f"--step reads a process reward model's steps, and {args.model} "
                            "has no step format: pass --step-tag TAG, or drop --step")
    return model


def require_objective(model: Any, objective: str | None) -> None:
    """Refuse a model of several objectives and no combined score when ``--objective`` is
    not given (no reward to read otherwise)."""
    if objective is None and len(model.objectives) > 1 and not model.has_score:
        raise TLRewardError(f"this model has objectives {model.objectives} and no combined "
                            "score; choose one with --objective NAME")


def add_report_options(parser: argparse.ArgumentParser, output: str,
                       cdn: str = "load plotly from a CDN") -> None:
    """``--cdn`` and ``--output`` (an HTML report, default ``output``)."""
    parser.add_argument("--cdn", action="store_true",
                        help=f"{cdn} (smaller file, needs a network to view)")
    parser.add_argument("--output", type=Path, default=Path(output), help="HTML report path")


def write_report(args: argparse.Namespace, parts: list[Any], title: str) -> Path:
    """Write ``parts`` to ``--output`` as one HTML file (offline unless ``--cdn``)."""
    from tl_reward.viz.html import save_html

    return save_html(args.output, *parts, title=title, offline=not args.cdn)


def add_ray_options(parser: argparse.ArgumentParser, what: str,
                    resume: str = "rerun the same command after an interruption to resume"
                    ) -> argparse._ArgumentGroup:
    """The ``Ray`` group: ``--ray``, ``--address``, ``--workers``, ``--gpus-per-worker``,
    ``--cpus-per-worker``; ``what`` says what the actors do, ``resume`` how to resume."""
    ray = parser.add_argument_group(
        "Ray", f"spread {what} over Ray actors (pip install \"tl-reward[ray]\"); each actor "
               f"loads the model once, this process writes the results; {resume}")
    ray.add_argument("--ray", action="store_true", help="run on a Ray cluster")
    ray.add_argument("--address", help="Ray cluster address (e.g. auto, ray://host:10001; "
                                       "default: start a local cluster)")
    ray.add_argument("--workers", type=int, help="actors (default: what the cluster allows)")
    ray.add_argument("--gpus-per-worker", type=float, default=0,
                     help="GPUs per actor (1: one model per GPU; default 0, CPU actors)")
    ray.add_argument("--cpus-per-worker", type=float, default=1, help="CPUs per actor")
    return ray


def ray_executor(args: argparse.Namespace, threads: int | None = None,
                 device_applies: bool = False) -> Any:
    """The :class:`~tl_reward.scale.RayExecutor` the Ray options name (``--device`` must be
    unset unless it still applies to this process: actors use the GPU Ray assigns them, or the
    CPU)."""
    from tl_reward.scale.executors import RayExecutor

    if not device_applies and getattr(args, "device", None) not in (None, "auto"):
        raise TLRewardError("--device does not apply with --ray; actors use the GPU Ray "
                            "assigns them (--gpus-per-worker) or the CPU")
    return RayExecutor(address=args.address, num_workers=args.workers,
                       num_gpus=args.gpus_per_worker, num_cpus=args.cpus_per_worker,
                       threads=threads)


def item_from_record(rec: dict[str, Any], where: str, also: str = "") -> Any:
    """A corpus item from one JSONL record: ``messages`` (a conversation), ``prompt`` and
    ``response``, or ``text``; ``also`` names what else the caller accepts, for the error."""
    if "messages" in rec:
        return rec["messages"]
    if "prompt" in rec and "steps" in rec:  # a process reward model's solution
        if not isinstance(rec["steps"], list) or not all(isinstance(x, str)
                                                         for x in rec["steps"]):
            raise TLRewardError(f"{where}: 'steps' must be a list of strings")
        return rec["prompt"], rec["steps"]
    if "prompt" in rec and "response" in rec:
        return rec["prompt"], rec["response"]
    if "text" in rec:
        return rec["text"]
    raise TLRewardError(f"{where}: need 'messages', 'prompt'+'response', 'prompt'+'steps' or "
                        f"'text'{also}")


def pair_from_record(rec: dict[str, Any], where: str) -> Any:
    """A :class:`~tl_reward.data.PreferencePair` from one JSONL record: ``prompt`` (string or
    messages), ``chosen`` and ``rejected`` replies, or HH-RLHF ``chosen``/``rejected``
    dialogues. ``where`` names the record in errors (``meta["source"]``: also in later ones)."""
    try:
        if {"prompt", "chosen", "rejected"} <= rec.keys():
            pair = PreferencePair.from_prompt(rec["prompt"], rec["chosen"], rec["rejected"])
        elif {"chosen", "rejected"} <= rec.keys():
            pair = pair_from_dialogues(rec["chosen"], rec["rejected"])
        else:
            raise TLRewardError(f"{where}: need 'prompt', 'chosen' and 'rejected' fields (or "
                                "HH-RLHF 'chosen'/'rejected' dialogues)")
    except EmptyResponseError as exc:  # its fix names a loader option the CLI does not have
        raise EmptyResponseError(f"{where}: {exc.problem}",
                                 "write both replies on that line, or delete the line") from None
    except TLRewardError:
        raise
    except ValueError as exc:
        raise TLRewardError(f"{where}: {exc}") from exc
    pair.meta["source"] = where
    return pair


def read_jsonl(path: Path, limit: int | None = None) -> list[tuple[str, dict[str, Any]]]:
    """``(where, record)`` for each non-blank line of a JSONL file (the first ``limit``);
    ``where`` is ``path:line`` (1-based). A missing file, bad JSON or a line that is not an
    object raises :class:`~tl_reward.errors.TLRewardError`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TLRewardError(f"cannot read {path}: {exc.strerror or exc}; check the path") from exc
    out = []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if limit is not None and len(out) >= limit:
            break
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TLRewardError(f"{path}:{i}: not valid JSON ({exc.msg} at column {exc.colno}); "
                                "each line must hold one JSON object") from exc
        if not isinstance(rec, dict):
            raise TLRewardError(f"{path}:{i}: a JSON {type(rec).__name__}, not an object")
        out.append((f"{path}:{i}", rec))
    return out


def read_pairs(path: Path, limit: int | None = None) -> list[Any]:
    """Every pair of a JSONL file (see :func:`pair_from_record`), the first ``limit`` only."""
    pairs = [pair_from_record(rec, where) for where, rec in read_jsonl(path, limit)]
    if not pairs:
        raise TLRewardError(f"{path} holds no pairs")
    return pairs
