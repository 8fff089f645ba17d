"""Take a tuned model elsewhere: ``s.export(dir, merge=True|False)``.

``merge=True`` writes a standalone checkpoint that plain ``AutoModelForCausalLM.from_pretrained``
loads (and vLLM, TGI or llama.cpp's converter take): safetensors weights with the adapter folded
in, the tokenizer, the generation config and a README model card. The merge happens on a fresh
copy of the base weights read from the session's checkpoint on the CPU, so the session keeps its
adapter, and a QLoRA session exports full-precision weights (merging into 4-bit weights would
round them). ``merge=False`` writes the adapter alone (PEFT's format) with the tokenizer and the
same card. Either way the folder is written next to the target and renamed into place, and a
non-empty folder nvkit did not write is never touched (``nvkit.model.saving``).

Hub upload is one line after an export (the machines here never reach the Hub)::

    from huggingface_hub import HfApi
    HfApi().upload_folder(folder_path=dir, repo_id="you/your-model")
"""

from __future__ import annotations

import datetime
import json
import os
import tempfile

from .. import events
from ..errors import NvkitError, require
from ..quiet import routed
from .saving import save_atomic


def _adapter_info(model) -> tuple[str | None, dict]:
    cfgs = getattr(model, "peft_config", None) or {}
    if not cfgs:
        return None, {}
    name = getattr(model, "active_adapter", None)
    name = name if isinstance(name, str) else next(iter(cfgs))
    c = cfgs[name]
    tm = getattr(c, "target_modules", None)
    return name, {"r": getattr(c, "r", None), "alpha": getattr(c, "lora_alpha", None),
                  "dropout": getattr(c, "lora_dropout", None),
                  "target_modules": sorted(tm) if isinstance(tm, (set, list, tuple)) else tm,
                  "use_dora": getattr(c, "use_dora", False), "use_rslora": getattr(c, "use_rslora", False)}


def _run_facts(session) -> dict:
    """The facts of the fine-tune that made the session's current adapter, when it did."""
    run = getattr(session, "training", None)
    trained = getattr(run, "trained", None)
    if run is None or not callable(trained) or not trained(session.model):
        return {}
    try:
        return dict(run.facts())
    except Exception:  # noqa: BLE001 - a card without the run's facts is still a card
        return {}


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def model_card(session, merged: bool, adapter_name: str | None, lora: dict, facts: dict) -> str:
    base = facts.get("base_model") or session.model_id
    library = "transformers" if merged else "peft"
    tags = ["nvkit"] + (["lora"] if adapter_name else []) + (["qlora"] if facts.get("qlora") else [])
    lines = ["---", f"base_model: {json.dumps(str(base))}", f"library_name: {library}", "tags:"]
    lines += [f"- {t}" for t in tags]
    if adapter_name is None:
        title, what = base, f"`{base}` as the nvkit session held it (no adapter)."
    elif merged:
        title, what = f"Merged {base}", f"A standalone checkpoint: LoRA adapter {adapter_name!r} merged into the weights of `{base}`."
    else:
        title, what = f"LoRA adapter for {base}", f"A PEFT LoRA adapter ({adapter_name!r}) for `{base}`."
    lines += ["---", "", f"# {title}", "", what, f"Exported by nvkit on {datetime.date.today().isoformat()}.", "",
              "## Training", ""]
    rows = [("base model", base)]
    data = facts.get("data") or {}
    if data:
        rows.append(("data", f"{data.get('examples')} {data.get('kind')} examples, {data.get('tokens')} tokens "
                              f"({data.get('target_tokens')} carry loss){', packed' if data.get('packing') else ''}"))
    for key, label in (("steps", "steps"), ("learning_rate", "learning rate"), ("batch_size", "batch size"),
                       ("grad_accum", "gradient accumulation"), ("seq_len", "sequence length"),
                       ("precision", "precision"), ("resumed_from", "resumed from"), ("stop_reason", "ended early")):
        if facts.get(key) is not None:
            rows.append((label, _fmt(facts[key])))
    if facts.get("qlora"):
        rows.append(("QLoRA", "trained on the 4-bit base; merged into the full-precision base weights"
                     if merged else "trained on the 4-bit base"))
    lo = {k: v for k, v in (lora or facts.get("lora") or {}).items() if v is not None}
    if lo:
        rows.append(("LoRA", ", ".join(f"{k}={_fmt(v)}" for k, v in lo.items())))
    for key, label in (("eval_before", "eval before"), ("eval_after", "eval after (final)")):
        ev = facts.get(key)
        if isinstance(ev, dict) and ev.get("eval_loss") is not None:
            rows.append((label, f"loss {ev['eval_loss']:.4f}, perplexity {ev['eval_perplexity']:.3f} "
                                f"(step {ev.get('step')})"))
    if not facts and adapter_name is not None:
        rows.append(("note", "the adapter was not trained in this session: only the model and LoRA settings are known"))
    lines += ["| | |", "|---|---|"] + [f"| {k} | {str(v).replace('|', '/')} |" for k, v in rows]
    load = ("from transformers import AutoModelForCausalLM, AutoTokenizer\n"
            "model = AutoModelForCausalLM.from_pretrained(PATH)\ntokenizer = AutoTokenizer.from_pretrained(PATH)"
            if merged else
            "from peft import AutoPeftModelForCausalLM\nfrom transformers import AutoTokenizer\n"
            "model = AutoPeftModelForCausalLM.from_pretrained(PATH)\ntokenizer = AutoTokenizer.from_pretrained(PATH)")
    lines += ["", "## Use", "", "```python", load, "```", ""]
    return "\n".join(lines)


def _merged_writer(session, adapter_name: str | None):
    """A function that writes the merged checkpoint into a folder."""
    model = session.model

    def write(folder: str) -> None:
        import torch
        with routed():
            from peft import PeftModel
            from transformers import AutoModelForCausalLM
        if adapter_name is None:
            model.save_pretrained(folder)
            return
        # the base weights as the checkpoint holds them, in the dtype the session loaded, on the CPU
        dtype = session.load_kwargs.get("dtype")
        if not isinstance(dtype, torch.dtype):
            dtype = torch.float32
        with tempfile.TemporaryDirectory(prefix="nvkit-export-adapter-") as tmp:
            model.save_pretrained(tmp, selected_adapters=[adapter_name])
            src = os.path.join(tmp, adapter_name) if adapter_name != "default" else tmp
            base = AutoModelForCausalLM.from_pretrained(
                session.path, dtype=dtype, device_map="cpu",
                trust_remote_code=bool(session.load_kwargs.get("trust_remote_code", False)))
            merged = PeftModel.from_pretrained(base, src).merge_and_unload()
        merged.save_pretrained(folder)

    return write


def export(session, directory, merge: bool = True) -> str:
    """Write the session's model for use elsewhere (see the module doc); returns the folder."""
    session._require_loaded()
    require(isinstance(merge, bool), f"merge must be True or False, not {merge!r}.")
    require(isinstance(directory, (str, os.PathLike)) and str(directory).strip(),
            f"export needs a folder path, not {directory!r}.")
    if session.busy:
        raise NvkitError("A generation is running in this session: wait for it or call s.stop() first.")
    run = session.training
    if run is not None and not run.done:
        raise NvkitError("A fine-tune is training this model: wait for it (await run) or run.stop() it first.")
    model = session.model
    adapter_name, lora = _adapter_info(model)
    kbit = bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))
    if not merge and adapter_name is None:
        raise NvkitError("merge=False exports the adapter, and the model has none: fine-tune or s.load_adapter(dir) "
                         "first, or export the whole model with merge=True.")
    if merge and adapter_name is None and kbit:
        raise NvkitError("The model is loaded in 4/8-bit and has no adapter to merge: its quantized weights are not a "
                         "standalone checkpoint. Load it unquantized to export it.")
    facts = _run_facts(session) if adapter_name is not None else {}
    card = model_card(session, merge, adapter_name, lora, facts)

    def write(folder: str) -> None:
        if merge:
            _merged_writer(session, adapter_name)(folder)
        else:
            model.save_pretrained(folder, selected_adapters=[adapter_name])
            if adapter_name != "default":  # PEFT puts a named adapter in a subfolder; keep the usual layout
                sub = os.path.join(folder, adapter_name)
                for name in os.listdir(sub):
                    os.replace(os.path.join(sub, name), os.path.join(folder, name))
                os.rmdir(sub)
        session.tokenizer.save_pretrained(folder)
        gen = getattr(model, "generation_config", None)
        if gen is not None and not os.path.isfile(os.path.join(folder, "generation_config.json")):
            gen.save_pretrained(folder)

    from transformers.utils import logging as hf_logging
    bars = hf_logging.is_progress_bar_enabled()
    if bars:  # the loading/writing bars would print into whichever cell runs
        hf_logging.disable_progress_bar()
    try:
        target = save_atomic(write, directory, {"README.md": card}, kind="export",
                             facts={"merged": merge, "adapter": adapter_name, "lora": lora, "run": facts,
                                    "base_model": session.model_id})
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    events.record("export", f"{'merged model' if merge else 'adapter'} exported to {target}")
    return target
