"""nvkit's Jupyter server extension: the REST routes the JupyterLab extension polls.

Enabled by ``jupyter-config/server-config/nvkit.json`` (installed into
``etc/jupyter/jupyter_server_config.d``) or ``jupyter server extension enable nvkit``.
"""

from __future__ import annotations


def _load_jupyter_server_extension(server_app) -> None:
    from .handlers import setup_handlers

    setup_handlers(server_app.web_app)
    server_app.log.info("nvkit: routes registered under %snvkit/api/",
                        server_app.web_app.settings["base_url"])


# jupyter_server < 2 looked for this name
load_jupyter_server_extension = _load_jupyter_server_extension
