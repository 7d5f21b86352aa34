"""A small FastAPI service used as an OpenAPI upstream (its own generated /openapi.json)."""

from __future__ import annotations

import os
from enum import StrEnum
from typing import Any

from fastapi import Depends, FastAPI, Form, Header, HTTPException, Query, Request, Response, UploadFile
from pydantic import BaseModel

API_KEY_ENV = "INVENTORY_TEST_KEY"


def require_key(x_api_key: str | None = Header(default=None)) -> None:
    if x_api_key != os.environ.get(API_KEY_ENV):
        raise HTTPException(status_code=401, detail="bad api key")


app = FastAPI(title="Inventory", version="1.0", dependencies=[Depends(require_key)])


class Kind(StrEnum):
    tool = "tool"
    part = "part"


class ItemIn(BaseModel):
    name: str
    kind: Kind
    price: float
    tags: list[str] = []


class Item(ItemIn):
    id: int


class Peer(BaseModel):
    port: int


ITEMS: dict[int, Item] = {}


@app.post("/items", operation_id="createItem", tags=["items"], status_code=201, summary="Create an item")
def create_item(item: ItemIn) -> Item:
    new = Item(id=len(ITEMS) + 1, **item.model_dump())
    ITEMS[new.id] = new
    return new


@app.get("/items/{item_id}", operation_id="getItem", tags=["items"], summary="Get one item by id")
def get_item(item_id: int, verbose: bool = False, x_trace: str | None = Header(default=None)) -> Item:
    if item_id not in ITEMS:
        raise HTTPException(status_code=404, detail=f"item {item_id} not found")
    item = ITEMS[item_id]
    if verbose and x_trace:
        return item.model_copy(update={"name": f"{item.name} [{x_trace}]"})
    return item


@app.get("/items", operation_id="listItems", tags=["items"], summary="List items, optionally by tag")
def list_items(tag: list[str] | None = Query(default=None), limit: int = 10) -> list[Item]:  # noqa: B008
    found = [i for i in ITEMS.values() if not tag or set(tag) & set(i.tags)]
    return found[:limit]


@app.delete("/items/{item_id}", operation_id="deleteItem", tags=["items"], status_code=204)
def delete_item(item_id: int) -> Response:
    ITEMS.pop(item_id, None)
    return Response(status_code=204)


@app.post("/items/search", operation_id="searchItems", tags=["search"], summary="Search items (a form)")
def search_items(
    name: str = Form(),
    tags: list[str] = Form(default=[]),  # noqa: B008
    max_price: float | None = Form(default=None),
    in_stock: bool = Form(default=False),
) -> list[Item]:
    return [
        i
        for i in ITEMS.values()
        if name in i.name
        and (not tags or set(tags) & set(i.tags))
        and (max_price is None or i.price <= max_price)
        and not in_stock  # nothing is ever in stock here: the flag must arrive as a boolean
    ]


@app.get("/big", operation_id="bigPayload", tags=["misc"])
def big() -> dict[str, str]:
    return {"blob": "x" * (2 * 1024 * 1024)}


@app.get("/broken", operation_id="broken", tags=["misc"], response_model=Item)
def broken() -> Any:
    return Response(content=b"<html>not json</html>", media_type="application/json")


@app.get("/peer", operation_id="peer", tags=["misc"])
def peer(request: Request) -> Peer:
    assert request.client is not None
    return Peer(port=request.client.port)


class Named(BaseModel):
    name: str


@app.get("/names/{name}", operation_id="peerByName", tags=["misc"])
def by_name(name: str) -> Named:
    return Named(name=name)


@app.put("/items/{item_id}/blob", operation_id="uploadBlob", tags=["files"])
async def upload(item_id: int, file: UploadFile) -> Peer:
    return Peer(port=0)


@app.post("/items/{item_id}/note", operation_id="attachNote", tags=["files"])
async def attach_note(item_id: int, file: UploadFile | None = None) -> Peer:
    """An optional multipart body: skipped with its reason, never converted without the body."""
    return Peer(port=0)


@app.get("/anything", operation_id="anything", tags=["misc"])
def anything() -> dict[str, Any]:
    return {}


# ------------------------------------------------------------------------------------------------
# A service under a path prefix, with routes the document does not declare (route-escape attacks).
# The document is `prefixed.openapi()` (paths relative to /api); calls go to base_url .../api.

SEEN: list[tuple[str, str | None]] = []  # (decoded path the router saw, X-API-Key it carried)

prefixed = FastAPI(title="Prefixed", version="1.0")
outer = FastAPI(openapi_url=None)


@outer.middleware("http")
async def record(request: Request, call_next: Any) -> Any:
    SEEN.append((request.scope["path"], request.headers.get("x-api-key")))
    return await call_next(request)


class User(BaseModel):
    id: str
    role: str


@prefixed.get("/users/{user_id}", operation_id="getUser")
def get_user(user_id: str) -> User:
    return User(id=user_id, role="user")


@prefixed.get("/users/{user_id}/admin", include_in_schema=False)
def undeclared_admin(user_id: str) -> User:
    return User(id=user_id, role="ADMIN (undeclared route)")


@prefixed.get("/files/{path:path}", operation_id="getFile")
def get_file(path: str) -> Named:
    """Declared as one segment in the document (`{path}`), routed as many, as Starlette allows."""
    return Named(name=path)


@prefixed.get("/echo/{status}", operation_id="echo", response_model=User)
def echo(status: int, x_api_key: str | None = Header(default=None)) -> Response:
    """A careless backend: its error bodies repeat the credential it was given."""
    import json

    body = {"detail": f"key {x_api_key} is not allowed here (full key: {x_api_key})"}
    headers = {"Location": f"/login?key={x_api_key}"} if status == 302 else None
    return Response(json.dumps(body), status_code=status, media_type="application/json", headers=headers)


@prefixed.get("/whoami/{status}", operation_id="whoami", response_model=User)
def whoami(status: int, api_key: str | None = Query(default=None)) -> Response:
    """Echoes the query-string key it was given, in a result (200) or an error body."""
    import json

    if status == 200:
        body = {"id": f"{api_key}", "role": f"caller with key {api_key}"}
    else:
        body = {"detail": f"rejected ?api_key={api_key}"}
    return Response(json.dumps(body), status_code=status, media_type="application/json")


@outer.get("/private/secret.json")
def private_secret() -> User:
    return User(id="secret", role="outside base_url")


outer.mount("/api", prefixed)
