"""``nvkit.GeneratePanel()``: prompt, chat, parameters, streamed output, Stop, stats; a view over
``Session.generate`` (and, with "Compare with base" on a model with an adapter, over
``nvkit.model.compare.acompare``: base and tuned side by side).

Generate starts the work in a worker thread and returns at once, so the kernel keeps serving
clicks (Stop) whether or not a cell is awaiting. Streamed text goes into one bounded HTML widget,
HTML-escaped, wrapped at word boundaries, refreshed a few times a second; in chat mode it is a
transcript (one block per turn). If no model is loaded, Generate loads nvkit's demo model first
and says so; a model loaded anywhere else shows up in the model line (nvkit's load events).
While the fast path captures or compiles (once per session each) the status line counts the seconds
(``on_progress``); the stats line gives the rate over the whole request and the decode rate.
"""

from __future__ import annotations

import asyncio
import html
import threading
import time

import ipywidgets as w

from .. import events
from ..errors import NvkitError
from ..model import imports
from ..threads import Job, run_in_worker
from .common import CodeToggle, current_session, observe_values, on_events, root, style, wrap_row
from .generate_views import (COMPARE_CSS, LIST_CSS, MAX_SHOWN_CHARS, compare_html, pre_html, prompt_lines,
                             results_html, stats_text, transcript_html)

REFRESH_S = 0.25           # at most ~4 output updates per second
DEFAULT_PROMPT = "NVIDIA GPUs are"
_WIDE = {"description_width": "initial"}


class GeneratePanel(w.VBox):
    """Generate text with the current session (``nvkit.session()``), or the demo model if none."""

    def __init__(self, session=None, **kwargs):
        self._session = session
        self.job: Job | None = None
        self.history: list[dict] = []   # chat turns so far: {"role": "user"|"assistant", "content": ...}
        self.text = ""                  # the last generation's full text
        self.last_error: str | None = None
        self.comparison = None          # the last "Compare with base" result (nvkit.model.compare.Comparison)
        self._lock = threading.Lock()
        self._progress_t = 0.0

        self.model_line = w.HTML("")
        self.model_line.add_class("nvkit-generate-model")
        self.prompt = w.Textarea(value=DEFAULT_PROMPT, placeholder="Prompt, e.g. NVIDIA GPUs are", rows=3,
                                 layout=w.Layout(width="auto"))
        self.prompt.add_class("nvkit-generate-prompt")
        self.chat = w.Checkbox(value=False, description="Chat (uses the tokenizer's chat template)", indent=False,
                               layout=w.Layout(width="auto"))
        self.chat.add_class("nvkit-generate-chat")
        self._build_compare()
        self.system = w.Text(placeholder="System prompt (chat mode, optional)", layout=w.Layout(width="auto"))
        self.system.add_class("nvkit-generate-system")
        self.max_new_tokens = w.BoundedIntText(value=64, min=1, max=32768, description="max new tokens",
                                               style=_WIDE, layout=w.Layout(width="210px"))
        self.sampling = w.ToggleButtons(options=[("Greedy", False), ("Sample", True)], value=False,
                                        style={"button_width": "auto"})
        self.sampling.add_class("nvkit-generate-sampling")
        self.temperature = w.BoundedFloatText(value=0.7, min=0.01, max=5.0, step=0.05, description="temperature",
                                              style=_WIDE, layout=w.Layout(width="170px"))
        self.top_p = w.BoundedFloatText(value=0.9, min=0.01, max=1.0, step=0.05, description="top_p",
                                        style=_WIDE, layout=w.Layout(width="130px"))
        self.top_k = w.BoundedIntText(value=50, min=0, max=100000, description="top_k", style=_WIDE,
                                      layout=w.Layout(width="130px"))
        self.repetition_penalty = w.BoundedFloatText(value=1.0, min=0.5, max=5.0, step=0.05,
                                                     description="repetition penalty", style=_WIDE,
                                                     layout=w.Layout(width="210px"))
        self.seed = w.Text(value="", placeholder="optional", description="seed", style=_WIDE,
                           layout=w.Layout(width="160px"))
        # Dropdown values are strings: a None value renders as a blank dropdown in the browser.
        self.fast = w.Dropdown(options=[("fast path: auto", "auto"), ("fast path: on", "on"), ("fast path: off", "off")],
                               value="auto", layout=w.Layout(width="160px"),
                               tooltip="nvkit's CUDA-graph decode for batch-1 greedy/sampled text (CUDA only)")
        self.fast.add_class("nvkit-generate-fast")
        self.deterministic = w.Checkbox(value=False, description="Same text alone or in a list", indent=False,
                                        layout=w.Layout(width="auto"),
                                        tooltip="deterministic=True: batch-invariant kernels, so a prompt's text "
                                                "does not change with the prompts beside it (lists run slower)")
        self.deterministic.add_class("nvkit-generate-deterministic")
        self.generate_button = w.Button(description="Generate", button_style="primary", icon="play")
        self.generate_button.add_class("nvkit-generate-button")
        self.stop_button = w.Button(description="Stop", icon="stop", disabled=True)
        self.stop_button.add_class("nvkit-stop-button")
        self.clear_button = w.Button(description="Clear chat", icon="eraser")
        self.clear_button.add_class("nvkit-clear-button")
        self.output = w.HTML(value="", layout=w.Layout(max_height="360px", overflow_y="auto", overflow_x="hidden",
                                                       border="1px solid var(--jp-border-color2)", padding="4px",
                                                       width="auto"))
        self.output.add_class("nvkit-generate-output")
        self.stats = w.HTML(value="")
        self.stats.add_class("nvkit-generate-stats")
        self.status = w.HTML(value="")
        self.status.add_class("nvkit-generate-status")
        self.code_view = CodeToggle(self.code)

        self.generate_button.on_click(lambda _b: self.start())
        self.stop_button.on_click(lambda _b: self.stop())
        self.clear_button.on_click(lambda _b: self.clear())
        self.sampling.observe(lambda _ch: self._sync_enabled(), "value")
        self.chat.observe(lambda _ch: self._sync_enabled(), "value")
        observe_values([self.prompt, self.max_new_tokens, self.temperature, self.top_p, self.top_k,
                        self.repetition_penalty, self.seed, self.fast, self.deterministic, self.system, self.compare],
                       self.code_view.refresh)
        self._sync_enabled()

        params = wrap_row([self.max_new_tokens, self.sampling, self.fast, self.deterministic])
        sample_params = wrap_row([self.temperature, self.top_p, self.top_k, self.repetition_penalty, self.seed])
        buttons = wrap_row([self.generate_button, self.stop_button, self.clear_button])
        super().__init__(children=[style(), self.compare_style, self.model_line, self.prompt,
                                   wrap_row([self.chat, self.compare]), self.system, params,
                                   sample_params, buttons, self.status, self.output, self.stats, self.code_view],
                         **kwargs)
        self.add_class("nvkit-generate-panel")
        root(self)
        self._show_model()
        self._sync_compare()
        on_events(self._on_event)
        self._build_list_mode()

    # --- state ---------------------------------------------------------------------------------
    def _sync_enabled(self):
        sample = self.sampling.value
        for c in (self.temperature, self.top_p, self.top_k):
            c.disabled = not sample
        self.system.disabled = not self.chat.value
        self.clear_button.disabled = not self.chat.value
        self.code_view.refresh()

    @property
    def busy(self) -> bool:
        return self.job is not None and not self.job.settled

    def _seed(self):
        raw = self.seed.value.strip()
        if not raw:
            return None
        try:
            return int(raw)
        except ValueError as e:
            raise NvkitError(f"The seed must be a whole number (or empty), not {raw!r}.") from e

    def generation_kwargs(self) -> dict:
        """The keywords Generate passes to ``Session.generate`` (besides the prompt and stream)."""
        kw: dict = {"max_new_tokens": int(self.max_new_tokens.value), "do_sample": bool(self.sampling.value)}
        if self.sampling.value:
            kw.update(temperature=float(self.temperature.value), top_p=float(self.top_p.value), top_k=int(self.top_k.value))
        if float(self.repetition_penalty.value) != 1.0:
            kw["repetition_penalty"] = float(self.repetition_penalty.value)
        seed = self._seed()
        if seed is not None:
            kw["seed"] = seed
        if self.chat.value:
            kw["chat"] = True
            if self.system.value.strip():
                kw["system"] = self.system.value
            if self.history:
                kw["history"] = [dict(m) for m in self.history]
        if self.fast.value != "auto":
            kw["fast"] = self.fast.value == "on"
        if self.deterministic.value:
            kw["deterministic"] = True
        return kw

    def code(self) -> str:
        """The Python that does what Generate does with the current settings."""
        if self.listing:
            return self._list_code()
        prompt = self.prompt.value
        kw = self.generation_kwargs()
        if self.comparing:
            return self._compare_code(prompt, kw)
        args = ", ".join([repr(prompt)] + [f"{k}={v!r}" for k, v in kw.items()])
        return ("import nvkit\n"
                "s = nvkit.session(required=False) or nvkit.load('demo')\n"
                f"out = s.generate({args},\n"
                "                 stream=lambda piece: print(piece, end='', flush=True))\n"
                "print()\n"
                "print(s.last_stats)\n")

    # --- following the session -----------------------------------------------------------------
    def _on_event(self, ev) -> None:
        if ev.kind in ("load", "unload", "attention", "adapter", "train-end"):
            self._show_model()
            self._sync_compare()

    def _show_model(self) -> None:
        s = self._current_session()
        if s is None:
            text = ("<span class='nvkit-muted'>No model is loaded: Generate loads nvkit's demo model first "
                    "(or load one in the Model tab).</span>")
        else:
            try:
                i = s.info
                text = (f"model <b>{html.escape(s.model_id)}</b> <span class='nvkit-muted'>"
                        f"{html.escape(i['architecture'])} · {html.escape(i['dtype'])} · "
                        f"{html.escape(', '.join(i['devices']))} · attention {html.escape(str(i['attention']))}</span>")
            except Exception:  # unloaded while we read it
                return
        if self.model_line.value != text:
            self.model_line.value = text

    # --- actions -------------------------------------------------------------------------------
    def _current_session(self):
        if self._session is not None and getattr(self._session, "model", None) is not None:
            return self._session
        return current_session()

    def _warm_for_demo(self) -> None:
        """With no model loaded the worker loads the demo model: what that imports is imported
        here first, in the thread that starts the worker (nvkit.model.imports says why)."""
        if self._current_session() is None:
            imports.for_load("demo")

    def start(self) -> Job | None:
        """Generate click: check the inputs, start the worker, return at once (the Job, or None
        when the inputs are wrong; the status says why)."""
        if self.listing:
            return self._start_list()
        if self.busy:
            self.status.value = "<span class='nvkit-warn'>Already generating: Stop it first.</span>"
            return None
        prompt = self.prompt.value
        try:
            if not prompt.strip():
                raise NvkitError("The prompt is empty: type some text to continue, e.g. 'NVIDIA GPUs are'.")
            kw = self.generation_kwargs()
        except NvkitError as e:
            self._error(e)
            return None
        if self.comparing:
            return self._start_compare(prompt, kw)
        self.last_error = None
        self.comparison = None
        self.text = ""
        self.stats.value = ""
        self.generate_button.disabled = True
        self.stop_button.disabled = False
        self._warm_for_demo()
        self.job = run_in_worker(lambda job: self._work(job, prompt, kw), name="nvkit-generate-panel")
        self.job.add_done_callback(lambda _j: self._finished())
        return self.job

    def _work(self, job: Job, prompt: str, kw: dict):
        s = self._current_session()
        if s is None:
            self.status.value = "No model was loaded: loading nvkit's demo model (nvkit.load('demo'))…"
            from .. import load
            s = load("demo")
            self.status.value = f"Loaded the demo model because no model was loaded: {html.escape(s.summary())}"
        else:
            self.status.value = f"Generating with {html.escape(s.model_id)}…"
        self._session = s
        if job.stop_event.is_set():
            return None
        chat = bool(kw.get("chat"))
        with self._lock:
            turns = [dict(m) for m in self.history]
        if chat and kw.get("system") and not turns:
            turns.insert(0, {"role": "system", "content": kw["system"]})
        turns.append({"role": "user", "content": prompt})
        pieces: list[str] = []
        last = [0.0]

        def flush(force=False):
            now = time.perf_counter()
            if force or now - last[0] >= REFRESH_S:
                last[0] = now
                new = "".join(pieces)
                if chat:
                    self.output.value = transcript_html(turns + [{"role": "assistant", "content": new}])
                else:
                    self.output.value = pre_html((prompt + new)[-MAX_SHOWN_CHARS:])

        def on_piece(piece: str):
            pieces.append(piece)
            if job.stop_event.is_set():  # Stop clicked just before the session's job existed
                s.stop()
            flush()

        def on_event(ev):
            if ev.kind in ("compile", "fast-off"):
                self.status.value = html.escape(ev.text)

        events.subscribe(on_event)
        try:
            out = s.generate(prompt, stream=on_piece, on_progress=self._on_progress, **kw)
        finally:
            events.unsubscribe(on_event)
            flush(force=True)
        self.text = out
        if chat:
            with self._lock:
                self.history += [{"role": "user", "content": prompt}, {"role": "assistant", "content": out}]
        return out

    def _finished(self):
        # the buttons come back last: once Generate is enabled, the status and the stats describe
        # the request that ended
        try:
            self._show_finished()
        finally:
            self.stop_button.disabled = True
            self.generate_button.disabled = False

    def _show_finished(self):
        job = self.job
        if job is not None and job.error is not None:
            self._error(job.error)
            return
        if self.comparison is not None or getattr(job, "compare", False):
            self._compare_finished()
            self.code_view.refresh()
            return
        s = self._session
        st = getattr(s, "last_stats", None) if s is not None else None
        if st is not None:
            self.stats.value = html.escape(stats_text(st))
            self.status.value = "Stopped." if st.stopped else "Done."
        self.code_view.refresh()

    def _error(self, e: BaseException):
        self.last_error = f"{type(e).__name__}: {e}"
        self.status.value = f"<span class='nvkit-error'>{html.escape(self.last_error)}</span>"

    def _on_progress(self, st) -> None:
        """``on_progress`` of the panel's requests (the worker thread, per token or chunk, and about
        once a second while the fast path captures or compiles): the status line says what is happening."""
        detail = str(getattr(st, "detail", "") or "")
        preparing = detail.startswith("preparing fast decode")
        now = time.perf_counter()
        if not preparing and now - self._progress_t < REFRESH_S:
            return
        self._progress_t = now
        s = self._session
        name = f" with {s.model_id}" if s is not None else ""
        text = html.escape(detail) if preparing else html.escape(f"Generating{name}… {st.new_tokens} tokens")
        if self.status.value != text:
            self.status.value = text

    # --- compare with base -------------------------------------------------------------------------
    def _build_compare(self) -> None:
        self.compare = w.Checkbox(value=False, description="Compare with base (adapter off vs on)", indent=False,
                                  layout=w.Layout(width="auto", display="none"),
                                  tooltip="each answer twice, same seed and settings: with the adapter off (the "
                                          "base model) and on (the tuned model), side by side")
        self.compare.add_class("nvkit-generate-compare")
        self.compare_style = w.HTML(f"<style>{COMPARE_CSS}</style>", layout=w.Layout(height="0px", margin="0"))

    def _adapter_attached(self) -> bool:
        s = self._current_session()
        return s is not None and bool(getattr(s.model, "peft_config", None))

    def _sync_compare(self) -> None:
        """The switch is there while the model carries an adapter (after a fine-tune, load_adapter)."""
        display = None if self._adapter_attached() else "none"
        if self.compare.layout.display != display:
            self.compare.layout.display = display

    @property
    def comparing(self) -> bool:
        """Whether Generate compares base and tuned (the switch is on and an adapter is attached)."""
        return bool(self.compare.value) and self._adapter_attached()

    @staticmethod
    def _compare_args(kw: dict) -> tuple[dict, dict]:
        """(acompare's own arguments, the generation keywords both sides share): no streaming, no
        fast-path choice and no chat history, which compare runs the same on both sides."""
        kw = {k: v for k, v in kw.items() if k not in ("fast", "history", "deterministic")}
        own = {"max_new_tokens": kw.pop("max_new_tokens"), "do_sample": kw.pop("do_sample"), "seed": kw.pop("seed", 0)}
        return own, kw

    def _compare_code(self, prompt: str, kw: dict) -> str:
        own, rest = self._compare_args(kw)
        args = ", ".join([repr([prompt])] + [f"{k}={v!r}" for k, v in {**own, **rest}.items()])
        return ("import nvkit\n"
                "s = nvkit.session()  # a model with an adapter (after nvkit.finetune or s.load_adapter)\n"
                f"cmp = s.compare({args})  # adapter off (base) and on (tuned), same seed\n"
                "cmp  # side by side, tok/s per side; print(cmp) as text\n")

    def _start_compare(self, prompt: str, kw: dict) -> Job:
        own, rest = self._compare_args(kw)
        self.last_error = None
        self.comparison = None
        self.text = ""
        self.stats.value = ""
        self.output.value = ""
        self.generate_button.disabled = True
        self.stop_button.disabled = False
        self.job = run_in_worker(lambda job: self._compare_work(job, prompt, own, rest), name="nvkit-generate-compare")
        self.job.compare = True  # type: ignore[attr-defined]
        self.job.add_done_callback(lambda _j: self._finished())
        return self.job

    def _compare_work(self, job: Job, prompt: str, own: dict, rest: dict):
        s = self._current_session()
        if s is None:
            raise NvkitError("No model is loaded: load one with an adapter (fine-tune it, or s.load_adapter(dir)).")
        self._session = s
        self.status.value = html.escape(f"Comparing with {s.model_id}: the base model (adapter off), then the "
                                        "tuned one (adapter on)…")
        from ..model.compare import acompare

        async def both():
            # awaited in this worker's own event loop, so the kernel's stays free for clicks
            task = asyncio.ensure_future(acompare(s, [prompt], **own, **rest))
            while not task.done():
                if job.stop_event.is_set():
                    task.cancel()
                    s.stop()
                    break
                await asyncio.sleep(0.05)
            try:
                return await task
            except asyncio.CancelledError:
                for _ in range(600):  # the side that ran ends within a token or two of s.stop()
                    if not s.busy:
                        break
                    await asyncio.sleep(0.05)
                return None

        cmp = asyncio.run(both())
        if cmp is None:
            return None
        self.comparison = cmp
        self.text = cmp.rows[0].tuned
        self.output.value = compare_html(cmp, prompt)
        return self.text

    def _compare_finished(self) -> None:
        job = self.job
        if job is not None and job.error is not None:
            self._error(job.error)
            return
        cmp = self.comparison
        if cmp is None:
            self.status.value = "Stopped: no comparison."
            return
        r = cmp.rows[0]
        self.stats.value = html.escape(f"base {r.base_tokens_per_s:.1f} tok/s · tuned {r.tuned_tokens_per_s:.1f} tok/s · "
                                       f"{'same answer' if r.same else 'the adapter changed the answer'} · "
                                       f"seed {cmp.settings.get('seed')}")
        self.status.value = "Done: base and tuned, same seed and settings."

    def stop(self):
        """Stop click: ends the generation within a few tokens."""
        job = self.job
        if job is not None and not job.done:
            job.stop()
            s = self._session
            if s is not None:
                s.stop()
            self.status.value = "Stopping…"

    def clear(self):
        """Clear chat: forget the history and empty the output."""
        with self._lock:
            self.history = []
        self.text = ""
        self.output.value = ""
        self.stats.value = ""
        self.status.value = "Chat cleared."
        self.code_view.refresh()

    def wait(self, timeout: float | None = None):
        """Block until the running generation ends (for scripts and tests); returns its text."""
        if self.job is None:
            return None
        return self.job.result(timeout=timeout)

    def close(self):
        self.stop()
        super().close()

    # --- list mode: many prompts at once, answers in a table ---------------------------------------
    def _build_list_mode(self) -> None:
        """The list switch and file loader under the prompt, the results table under the output.

        With "Prompt list" on, every line of the prompt box (or of a loaded .txt / .jsonl file) is a
        prompt; Generate runs them all at once (``Session.generate(list)``: nvkit's batched fast path
        on a GPU), the status line counts prompts done and tok/s, Stop keeps the answers that
        finished, and the answers fill a table in the prompts' order."""
        self.outputs: list[str] = []     # the last list's answers, in the prompts' order ("" : stopped first)
        self.list_prompts: list[str] = []
        self.list_mode = w.Checkbox(value=False, description="Prompt list (one prompt per line)", indent=False,
                                    layout=w.Layout(width="auto"))
        self.list_mode.add_class("nvkit-generate-list")
        self.prompt_file = w.FileUpload(accept=".txt,.jsonl", multiple=False, description="Load prompts",
                                        layout=w.Layout(width="auto", display="none"))
        self.prompt_file.add_class("nvkit-generate-file")
        self.results = w.HTML(value="", layout=w.Layout(max_height="420px", overflow_y="auto", width="auto",
                                                         display="none"))
        self.results.add_class("nvkit-generate-results")
        self.list_mode.observe(lambda _ch: self._sync_list_mode(), "value")
        self.prompt_file.observe(self._on_prompt_file, "value")
        self.list_mode.observe(lambda _ch: self.code_view.refresh(), "value")
        kids = list(self.children)
        at = kids.index(self.prompt) + 1
        kids[at:at] = [wrap_row([self.list_mode, self.prompt_file])]
        at = kids.index(self.output) + 1
        kids[at:at] = [w.HTML(f"<style>{LIST_CSS}</style>"), self.results]
        self.children = tuple(kids)

    @property
    def listing(self) -> bool:
        """True when Generate runs the prompt box as a list (one prompt per line)."""
        lm = getattr(self, "list_mode", None)
        return bool(lm is not None and lm.value)

    def _sync_list_mode(self) -> None:
        on = self.list_mode.value
        self.prompt_file.layout.display = "" if on else "none"
        self.results.layout.display = "" if on else "none"
        self.output.layout.display = "none" if on else ""  # answers go to the table, nothing streams
        self.prompt.rows = 8 if on else 3
        self.prompt.placeholder = "One prompt per line" if on else "Prompt, e.g. NVIDIA GPUs are"

    def _on_prompt_file(self, change) -> None:
        files = change["new"]
        if not files:
            return
        f = files[0] if isinstance(files, (list, tuple)) else next(iter(files.values()))  # ipywidgets 8, 7
        if isinstance(f, dict):
            name, content = f.get("name") or f.get("metadata", {}).get("name", ""), f["content"]
        else:
            name, content = getattr(f, "name", ""), f.content
        try:
            text = bytes(content).decode("utf-8")
            prompts, joined = prompt_lines(text, name)
            if not prompts:
                raise NvkitError(f"{name or 'The file'} holds no prompts: one prompt per line.")
        except UnicodeDecodeError:
            self._error(NvkitError(f"{name} is not UTF-8 text: save it as UTF-8, one prompt per line."))
            return
        except NvkitError as e:
            self._error(e)
            return
        self.list_mode.value = True
        self.prompt.value = "\n".join(prompts)
        self.prompt_file.value = ()  # the same file can be loaded again after an edit
        note = f"; {joined} had line breaks, joined with spaces" if joined else ""
        self.status.value = html.escape(f"Loaded {len(prompts)} prompts from {name}{note}.")

    def prompts(self) -> list[str]:
        """The prompts Generate runs in list mode: the prompt box's non-empty lines."""
        return prompt_lines(self.prompt.value)[0]

    def _list_kwargs(self) -> dict:
        kw = self.generation_kwargs()
        kw.pop("history", None)  # each prompt of a list is a conversation of its own
        return kw

    def _list_code(self) -> str:
        prompts = self.prompts()
        args = ", ".join(["prompts"] + [f"{k}={v!r}" for k, v in self._list_kwargs().items()])
        return ("import nvkit\n"
                "s = nvkit.session(required=False) or nvkit.load('demo')\n"
                f"prompts = {prompts!r}\n"
                f"outs = s.generate({args},\n"
                "                  on_progress=lambda st: print(f'\\r{st.prompts_done}/{len(prompts)} prompts', end=''))\n"
                "print()\n"
                "for prompt, out in zip(prompts, outs):\n"
                "    print(repr(prompt), '->', repr(out))\n"
                "print(s.last_stats)\n")

    def _start_list(self) -> Job | None:
        """Generate in list mode: every line a prompt, all at once (``Session.generate(list)``)."""
        if self.busy:
            self.status.value = "<span class='nvkit-warn'>Already generating: Stop it first.</span>"
            return None
        try:
            prompts = self.prompts()
            if not prompts:
                raise NvkitError("The prompt list is empty: type one prompt per line, or load a file.")
            kw = self._list_kwargs()
        except NvkitError as e:
            self._error(e)
            return None
        self.last_error = None
        self.list_prompts, self.outputs = prompts, []
        self.stats.value = ""
        self.output.value = ""
        self.results.value = results_html(prompts, None)
        self.generate_button.disabled = True
        self.stop_button.disabled = False
        self._warm_for_demo()
        self.job = run_in_worker(lambda job: self._work_list(job, prompts, kw), name="nvkit-generate-panel")
        self.job.add_done_callback(lambda _j: self._list_finished())
        return self.job

    def _work_list(self, job: Job, prompts: list[str], kw: dict):
        s = self._current_session()
        if s is None:
            self.status.value = "No model was loaded: loading nvkit's demo model (nvkit.load('demo'))…"
            from .. import load
            s = load("demo")
        self._session = s
        if job.stop_event.is_set():
            return None
        n = len(prompts)
        self.status.value = html.escape(f"Generating {n} prompts with {s.model_id}…")
        t0 = time.perf_counter()
        last = [0.0]

        def on_progress(st):
            if job.stop_event.is_set():  # Stop clicked just before the session's job existed
                s.stop()
            now = time.perf_counter()
            if now - last[0] < REFRESH_S:
                return
            last[0] = now
            if st.detail.startswith("preparing"):
                self.status.value = html.escape(st.detail)
                return
            rate = st.new_tokens / (now - t0) if now > t0 else 0.0
            self.status.value = html.escape(f"{st.prompts_done}/{n} prompts · {st.new_tokens} tokens · {rate:,.0f} tok/s")

        outs = s.generate(prompts, on_progress=on_progress, **kw)
        self.outputs = list(outs)
        self.text = outs[-1] if outs else ""
        return outs

    def _list_finished(self) -> None:
        try:
            self._show_list_finished()
        finally:
            self.stop_button.disabled = True
            self.generate_button.disabled = False

    def _show_list_finished(self) -> None:
        job = self.job
        if job is not None and job.error is not None:
            self._error(job.error)
            return
        s = self._session
        st = getattr(s, "last_stats", None) if s is not None else None
        stopped = bool(st is not None and st.stopped)
        self.results.value = results_html(self.list_prompts, self.outputs or [""] * len(self.list_prompts), stopped)
        if st is not None:
            done = st.prompts_done if stopped else len(self.list_prompts)
            rate = st.new_tokens / st.seconds if st.seconds else 0.0
            self.stats.value = html.escape(f"{done}/{len(self.list_prompts)} prompts · {st.new_tokens} tokens in "
                                           f"{st.seconds:.2f} s · {rate:,.1f} tok/s · path {st.how}"
                                           f"{' · stopped' if stopped else ''}")
            self.status.value = "Stopped: the finished answers are shown." if stopped else "Done."
        self.code_view.refresh()
