"""Another aiohttp application served under a prefix of this one (the viewer on the interception server's port).

`/prefix` redirects to `/prefix/` (the page's relative links resolve under the slash); with `root=True`, `/` does
too, so a bare address (a Hugging Face Space's) opens the mounted page.
"""

from __future__ import annotations

from aiohttp import web

__all__ = ["mount_under"]


def mount_under(app: web.Application, prefix: str, mounted: web.Application, *, root: bool = False) -> None:
    prefix = "/" + prefix.strip("/")

    async def to_page(request: web.Request) -> web.Response:
        raise web.HTTPFound(prefix + "/" + (f"?{request.query_string}" if request.query_string else ""))

    app.router.add_get(prefix, to_page)
    if root:
        app.router.add_get("/", to_page)
    app.add_subapp(prefix + "/", mounted)
