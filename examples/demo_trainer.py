"""A tiny "trainer" that reads batches from a Zephon server, as a real training loop would.

    python examples/demo_trainer.py --address localhost:50051 --rank 0 --world-size 1

Each rank reads its own lanes; every ``--checkpoint-every`` steps it asks the server to
checkpoint the positions it has consumed, so a restarted job resumes exactly there.
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
    parser.add_argument("--checkpoint-every", type=int, default=50, help="0: never")
    args = parser.parse_args()
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
                client.checkpoint(tag=f"step-{step}")  # logs its id and per-lane positions
            if step >= args.steps:
                break
    log.info("done: %d tokens in %.1f s", tokens, time.monotonic() - start)


if __name__ == "__main__":
    main()
