"""A tiny "trainer" that reads batches from a Zephon server, as a real training loop would.

    python examples/demo_trainer.py --address localhost:50051 --rank 0 --world-size 1

Each rank reads its own lanes. A single rank checkpoints every ``--checkpoint-every`` steps:
it marks the batch it just trained on as consumed, then asks the server to checkpoint, so a
restarted job resumes exactly after it. Several ranks must merge their positions before one of
them checkpoints (a collective, docs/trainer-integration.md), which this demo has no means for:
with ``--world-size`` above 1 it does not checkpoint.
"""

from __future__ import annotations

import argparse
import logging
import time

from zephon_client import DataClient

log = logging.getLogger("demo_trainer")


def main() -> None:
    """Parse the flags and run the loop."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="localhost:50051", help="server host:port")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--steps", type=int, default=100, help="batches to consume")
    parser.add_argument(
        "--checkpoint-every", type=int, default=None, help="0: never (default 50, one rank)"
    )
    args = parser.parse_args()
    if args.world_size > 1 and args.checkpoint_every:
        parser.error(
            "--checkpoint-every with --world-size > 1: the ranks' positions must be merged "
            "before a checkpoint (docs/trainer-integration.md), which this demo cannot do"
        )
    if args.checkpoint_every is None:
        args.checkpoint_every = 50 if args.world_size == 1 else 0
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    start, tokens = time.monotonic(), 0
    with DataClient(args.address, rank=args.rank, world_size=args.world_size) as client:
        for step, batch in enumerate(client, start=1):
            tokens += batch.tensors["input_ids"].size
            # A real trainer would run forward/backward on batch.tensors here.
            if step == 1:
                shapes = {name: (str(t.dtype), t.shape) for name, t in batch.tensors.items()}
                log.info("batch tensors: %s", shapes)
            if step % 10 == 0:
                rate = tokens / (time.monotonic() - start)
                log.info(
                    "step %d (lane %d seq %d): %.0f tokens/s", step, batch.lane, batch.seq, rate
                )
            if args.checkpoint_every and step % args.checkpoint_every == 0:
                client.mark_consumed()  # the batch just trained on is part of the position
                client.checkpoint(tag=f"step-{step}")  # logs its id and per-lane positions
            if step >= args.steps:
                break
    log.info("done: %d tokens in %.1f s", tokens, time.monotonic() - start)


if __name__ == "__main__":
    main()
