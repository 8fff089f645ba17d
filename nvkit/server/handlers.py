"""REST routes under ``{base_url}nvkit/api/``. Every handler is an ``APIHandler`` whose methods are
``@tornado.web.authenticated`` and ``@authorized`` under the resource Jupyter's own routes use for
the same data ("kernels" for the GPU list with its kernels, "contents" for the tutorials), so a
server's ``Authorizer`` governs them as it governs Jupyter's. POST is XSRF-checked by
jupyter_server (cookie-authenticated requests must carry ``X-XSRFToken``). Nothing from a request
becomes a path except through the contents manager, and a write target's real path (links
resolved) must lie inside the served root. Errors are JSON 4xx answers with a message that names
no absolute server path.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import posixpath
import re

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import ensure_async, url_path_join

from . import attribution, tutorial_copy, tutorials

# the copy route's body is {"dir": "sub/folder"}: anything much larger is not a request of ours
MAX_BODY_BYTES = 16 * 1024


def gpu_status() -> dict:
    """``{"gpus": [GPU.to_dict()...], "count", "reason"}``: reason says why the list is empty."""
    try:
        gpus_mod = importlib.import_module("nvkit.hardware.inventory")
    except Exception as e:  # the core module failed to import: say so instead of a 500
        return {"gpus": [], "count": 0, "reason": f"nvkit.hardware.inventory could not be imported: {e}"}
    try:
        found = [g.to_dict() for g in gpus_mod.gpus()]
    except Exception as e:  # NVML errors: report, the status bar keeps polling
        return {"gpus": [], "count": 0, "reason": f"reading the GPUs failed: {e}"}
    reason = None
    if not found:
        try:
            reason = gpus_mod.nvml_status().reason
        except Exception as e:
            reason = str(e)
        reason = reason or "No NVIDIA GPU or driver found on the server."
    return {"gpus": found, "count": len(found), "reason": reason}


def _is_own_process(pid: int) -> bool:
    try:
        return importlib.import_module("nvkit.hardware.inventory").is_own_process(pid)
    except Exception:
        return False


def attribute(status: dict, kernels: list) -> dict:
    """Add each GPU's kernels and other processes to ``gpu_status()``'s answer (in place)."""
    try:
        reports = {}
        for k in kernels:
            r = attribution.read_report(k, _is_own_process)
            if r is not None:
                reports[k.id] = r
        attribution.attribute(status["gpus"], kernels, reports, _is_own_process)
        status["attribution"] = {"ok": True, "reason": None}
    except Exception as e:     # keep the GPU list; say why kernels are missing; show no names
        for g in status["gpus"]:
            g["processes"] = [dict(p, name=None) for p in g.get("processes") or []]
            g["kernels"] = []
            g["other_processes"] = g["processes"]
        status["attribution"] = {"ok": False,
                                 "reason": f"mapping GPU memory to kernels failed: {type(e).__name__}: {e}"}
    return status


class GpusHandler(APIHandler):
    # the answer names kernels, their notebooks, pids and execution state: what Jupyter's own
    # kernel routes show, under the same permission (an authorizer that denies kernels denies this)
    auth_resource = "kernels"

    @tornado.web.authenticated
    @authorized
    async def get(self):
        loop = asyncio.get_running_loop()
        # NVML is quick (~10 µs a call) but its first init can take a while: keep the loop free.
        status = await loop.run_in_executor(None, gpu_status)
        kernels = await attribution.kernel_facts(self.kernel_manager, self.session_manager)
        # /proc and the report files are small reads, but reads all the same
        status = await loop.run_in_executor(None, attribute, status, kernels)
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(status))


class TutorialsHandler(APIHandler):
    # the list only serves the copy route, which writes contents: reading it is a contents read
    auth_resource = "contents"

    @tornado.web.authenticated
    @authorized
    def get(self):
        # name and title only: where the files lie on the server's disk is none of the page's business
        self.finish(json.dumps({"tutorials": [{"name": t["name"], "title": t["title"]}
                                              for t in tutorials.list_tutorials()]}))


def _clean_dir(value) -> str:
    """A request's target folder as a contents-manager path ('' = the root). Refuses absolute
    paths, backslashes, '..' and hidden parts outright instead of normalizing them away."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise tornado.web.HTTPError(400, "dir must be a string")
    if "\\" in value or "\x00" in value or value.startswith("/") or value.startswith("~") \
            or (len(value) > 1 and value[1] == ":"):
        raise tornado.web.HTTPError(400, "dir must be a path relative to the server root")
    parts = [p for p in value.split("/") if p not in ("", ".")]
    if any(p == ".." or p.startswith(".") for p in parts):
        raise tornado.web.HTTPError(400, "dir must stay inside the server root")
    return "/".join(parts)


def _os_root(cm) -> str | None:
    """The folder a file-system contents manager serves; None for one that keeps files elsewhere
    (a database, S3), which then keeps paths inside itself."""
    root = getattr(cm, "root_dir", None)
    return root if isinstance(root, str) and os.path.isdir(root) else None


def _check_inside_root(cm, api_path: str) -> None:
    """Refuse a write whose real target (every link resolved) lies outside the served root: the
    contents manager checks the path as written, and its atomic save follows links."""
    root = _os_root(cm)
    if root is None:
        return
    real_root = os.path.realpath(root)
    target = os.path.realpath(os.path.join(root, *api_path.split("/")))
    if os.path.commonpath([real_root, target]) != real_root:
        raise tornado.web.HTTPError(
            403, f"{api_path} is, or lies in, a link that leads outside the server's root folder; "
                 "nvkit does not write through it. Remove the link or pick another folder.")


def _scrub(text: str, cm) -> str:
    """An error text without absolute server paths (the page only knows paths under the root)."""
    text = str(text or "")
    root = _os_root(cm)
    for r in filter(None, {root, root and os.path.realpath(root)}):
        text = text.replace(r.rstrip(os.sep) + os.sep, "").replace(r, ".")
    return re.sub(r"(?<![\w.])/[^\s'\"]+", "<path>", text)


class TutorialCopyHandler(APIHandler):
    """POST ``tutorials/<name>`` with an optional JSON body ``{"dir": "sub/folder"}`` copies the
    tutorial into that folder of the server root. An existing file is never replaced unless the
    request says ``?overwrite=true``: the answer is 409 with the path, and the frontend asks."""

    # it writes a file: the same permission as the contents API's POST (an authorizer may refuse)
    auth_resource = "contents"

    @tornado.web.authenticated
    @authorized
    async def post(self, name: str):
        src = tutorials.find_tutorial(name)
        if src is None:
            raise tornado.web.HTTPError(404, "no such tutorial")
        body = {}
        if self.request.body:
            if len(self.request.body) > MAX_BODY_BYTES:
                raise tornado.web.HTTPError(413, f"the body must be a small JSON object such as "
                                                 f'{{"dir": "sub/folder"}} (at most {MAX_BODY_BYTES} bytes)')
            try:
                body = json.loads(self.request.body)
            except (ValueError, RecursionError) as e:   # RecursionError: nesting deeper than Python's stack
                raise tornado.web.HTTPError(400, "body must be JSON") from e
            if not isinstance(body, dict):
                raise tornado.web.HTTPError(400, "body must be a JSON object")
        folder = _clean_dir(body.get("dir"))
        overwrite = self.get_query_argument("overwrite", "false").lower() in ("1", "true", "yes")
        cm = self.contents_manager
        if folder and not await ensure_async(cm.dir_exists(folder)):
            raise tornado.web.HTTPError(404, "no such folder")
        dest = posixpath.join(folder, src.name) if folder else src.name
        _check_inside_root(cm, dest)
        if await ensure_async(cm.dir_exists(dest)):
            raise tornado.web.HTTPError(409, f"{dest} is a folder: rename it, or copy the tutorial "
                                             "into another folder")
        try:
            content = tutorial_copy.read_tutorial(src)
        except (OSError, ValueError) as e:
            raise tornado.web.HTTPError(404, f"the tutorial {src.name} could not be read "
                                             f"({type(e).__name__}); reinstall nvkit") from None
        exists = await ensure_async(cm.file_exists(dest))
        if exists and not overwrite:
            self.set_status(409)
            self.finish(json.dumps({"message": f"{dest} already exists", "path": dest,
                                    "exists": True,
                                    "unchanged": await self._unchanged(cm, dest, content)}))
            return
        try:
            model = await tutorial_copy.save_or_undo(cm, content, dest, _os_root(cm))
        except tornado.web.HTTPError as e:
            # the contents manager's 5xx texts carry absolute paths: say it as a 4xx without them
            code = e.status_code if 400 <= e.status_code < 500 else 409
            raise tornado.web.HTTPError(code, f"could not write {dest}: "
                                              f"{_scrub(e.log_message, cm)}") from None
        except OSError as e:
            raise tornado.web.HTTPError(409, f"could not write {dest}: {e.strerror}") from None
        self.set_status(200 if exists else 201)
        self.finish(json.dumps({"path": model["path"], "name": model["name"],
                                "overwritten": bool(exists)}))

    @staticmethod
    async def _unchanged(cm, dest: str, tutorial) -> bool:
        """Whether the existing copy is still the tutorial as shipped (then the page opens it
        without asking: there are no changes of the user's to lose or keep)."""
        try:
            model = await ensure_async(cm.get(dest, content=True, type="notebook"))
        except Exception:      # unreadable as a notebook: the user decides what to do with it
            return False
        return tutorial_copy.same_as_tutorial(model.get("content"), tutorial)


def setup_handlers(web_app) -> None:
    base = url_path_join(web_app.settings["base_url"], "nvkit", "api")
    web_app.add_handlers(".*$", [
        (url_path_join(base, "gpus"), GpusHandler),
        (url_path_join(base, "tutorials"), TutorialsHandler),
        # [^/]+ on the raw (still percent-encoded) path; the decoded name is then only ever
        # compared with the listed tutorial names.
        (url_path_join(base, "tutorials", r"([^/]+)"), TutorialCopyHandler),
    ])
