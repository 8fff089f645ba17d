"""REST routes under ``{base_url}nvkit/api/``. Every handler is an ``APIHandler`` whose methods are
``@tornado.web.authenticated``; POST is XSRF-checked by jupyter_server (cookie-authenticated
requests must carry ``X-XSRFToken``). Nothing from a request becomes a path except through the
contents manager, which keeps it inside the served root.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import posixpath

import tornado.web
from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import ensure_async, url_path_join

from . import tutorials


def gpu_status() -> dict:
    """``{"gpus": [GPU.to_dict()...], "count", "reason"}``: reason says why the list is empty."""
    try:
        gpus_mod = importlib.import_module("nvkit.hardware.inventory")
    except Exception as e:  # the core module failed to import: say so instead of a 500
        return {"gpus": [], "count": 0, "reason": f"nvkit.gpus could not be imported: {e}"}
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


class GpusHandler(APIHandler):
    @tornado.web.authenticated
    async def get(self):
        # NVML is quick (~10 µs a call) but its first init can take a while: keep the loop free.
        status = await asyncio.get_running_loop().run_in_executor(None, gpu_status)
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(status))


class TutorialsHandler(APIHandler):
    @tornado.web.authenticated
    def get(self):
        self.finish(json.dumps({"tutorials": tutorials.list_tutorials()}))


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
            try:
                body = json.loads(self.request.body)
            except ValueError as e:
                raise tornado.web.HTTPError(400, "body must be JSON") from e
            if not isinstance(body, dict):
                raise tornado.web.HTTPError(400, "body must be a JSON object")
        folder = _clean_dir(body.get("dir"))
        overwrite = self.get_query_argument("overwrite", "false").lower() in ("1", "true", "yes")
        cm = self.contents_manager
        if folder and not await ensure_async(cm.dir_exists(folder)):
            raise tornado.web.HTTPError(404, "no such folder")
        dest = posixpath.join(folder, src.name) if folder else src.name
        exists = await ensure_async(cm.file_exists(dest))
        if exists and not overwrite:
            self.set_status(409)
            self.finish(json.dumps({"message": f"{dest} already exists", "path": dest,
                                    "exists": True}))
            return
        content = json.loads(src.read_text(encoding="utf-8"))
        model = await ensure_async(cm.save({"type": "notebook", "format": "json",
                                            "content": content}, dest))
        self.set_status(200 if exists else 201)
        self.finish(json.dumps({"path": model["path"], "name": model["name"],
                                "overwritten": bool(exists)}))


def setup_handlers(web_app) -> None:
    base = url_path_join(web_app.settings["base_url"], "nvkit", "api")
    web_app.add_handlers(".*$", [
        (url_path_join(base, "gpus"), GpusHandler),
        (url_path_join(base, "tutorials"), TutorialsHandler),
        # [^/]+ on the raw (still percent-encoded) path; the decoded name is then only ever
        # compared with the listed tutorial names.
        (url_path_join(base, "tutorials", r"([^/]+)"), TutorialCopyHandler),
    ])
