"""The web page: a chat playground (`/`) and a live dashboard (`/dashboard`), plain
HTML/JS/CSS from `api/static/`, no build step."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"

router = APIRouter()


@router.get("/", include_in_schema=False)
async def playground() -> FileResponse:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


@router.get("/dashboard", include_in_schema=False)
async def dashboard() -> FileResponse:
    return FileResponse(STATIC / "dashboard.html", headers={"Cache-Control": "no-cache"})


def install(app: FastAPI) -> None:
    app.include_router(router)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
