"""Seed 001 §9's "complete production example", in Python, against any siglo URL.

    python examples/production.py redis://127.0.0.1:6379/0

Registers the backend's adapter globally, then runs the single-flight settlement under a
distributed lock and a webhook handler with replay protection and an idempotency claim.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import siglo
from siglo import Step, flow
from siglo.workflow import run_input


async def fetch_rates(_: Any) -> dict[str, float]:
    # An external HTTP call, cached for 5 minutes.
    return {"EUR": 1.08, "GBP": 1.27, "JPY": 154.2}


async def settle_invoice(rates: dict[str, float]) -> dict[str, Any]:
    # Each step gets the previous step's output (the rates); the invoice is the run's input.
    invoice = run_input()
    return {
        "invoiceId": invoice["invoiceId"],
        "settled": True,
        "amountUSD": invoice["amount"] * rates[invoice["currency"]],
    }


def billing_flow() -> siglo.Flow:
    fetch = Step.create("fetchRates", fetch_rates).cache(
        ttl_ms=300_000, key=lambda: "currency-rates-latest"
    )
    return flow(fetch, Step.create("settleInvoice", settle_invoice))


class Service:
    """The seed's globals, bundled: adapter registered, lock, idempotency, nonces."""

    def __init__(self, backend: siglo.Backend) -> None:
        if backend.lock is None or backend.idempotency is None or backend.nonces is None:
            raise siglo.CapabilityNotSupportedError(f"{backend.name} lacks lock/idempotency/nonces")
        self.backend = backend
        self.lock = backend.lock
        self.idempotency = backend.idempotency
        self.nonces = backend.nonces
        siglo.use_storage(backend)  # 2. register the global storage adapter
        self.flow = billing_flow()

    async def process_daily_settlement(self, run_id: str) -> Any:
        """5. Single-flight execution under a distributed lock (15-second TTL)."""

        async def settle() -> Any:
            return await self.flow.run(
                {"invoiceId": "INV-2026-10", "amount": 5000, "currency": "EUR"},
                stack_id=run_id,
            )

        return await self.lock.with_lock("lock:daily-settlement", settle, 15_000)

    async def handle_webhook(self, signature: str, payload: dict[str, Any]) -> Any:
        """6. Webhook ingestion with replay protection and idempotency."""
        if not await self.nonces.claim(signature, 300):
            raise PermissionError("Duplicate or replayed webhook signature detected")
        state = await self.idempotency.claim(payload["id"])
        if state == "completed":
            return await self.idempotency.get_result(payload["id"])
        if state == "in-progress":
            raise RuntimeError("Concurrent execution already in progress")
        try:
            result = {"processed": True, "id": payload["id"]}
            await self.idempotency.complete(payload["id"], result)
            return result
        except BaseException as err:
            await self.idempotency.fail(payload["id"], err)
            raise


async def main(url: str) -> None:
    async with siglo.connect(url) as backend:  # 1. the client (7. closed on exit)
        service = Service(backend)
        print(await service.process_daily_settlement("settlement-2026-11-29"))
        try:
            print(await service.handle_webhook("sig-1", {"id": "evt_1", "amount": 10}))
        except PermissionError as refused:
            # Run twice on one store: the settlement run is found and its result returned
            # (flow.run is run-or-continue), and this second delivery of sig-1 is a replay.
            print(f"refused: {refused}")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "memory://"))
