"""One view that settles an order under a lease lock."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import path
from lease_lock import LockHeldError
from lease_lock.contrib.django import locker

__all__ = ["settle", "urlpatterns"]


def settle(request: HttpRequest, order_id: int) -> JsonResponse:
    """Settle an order, or answer 409 while another request is settling it."""
    try:
        with locker.lock(f"order:{order_id}", blocking=False) as lock:
            return JsonResponse({"order": order_id, "held": locker.get(f"order:{order_id}").held, "key": lock.key})
    except LockHeldError:
        return JsonResponse({"order": order_id, "busy": True}, status=409)


urlpatterns = [path("orders/<int:order_id>/settle", settle)]
