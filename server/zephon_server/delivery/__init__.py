"""The delivery layer: the engine's numbered batches, served to consumers.

Between the engine (which makes each lane's :class:`~zephon_server.engine.numbered_batch.
NumberedBatch` values) and the gRPC service (which only adapts this package to the protocol):

* :mod:`.hub`: the per-lane log shared by every consumer of a lane, its bound (the producer
  waits), acknowledgements, checkpoint waits and stats;
* :mod:`.lane_buffer`: one lane's recent batches, consumers and their positions;
* :mod:`.readers`: one consumer's stream of a lane, from the log or from a shared replay;
* :mod:`.replays`: shared replays serving seqs the log no longer holds (the engine regenerates;
  this layer serves);
* :mod:`.streams`: a server's streams (named consumers, the stream limit, draining) and one
  consumer's stream of a lane;
* :mod:`.acks`: a stream's send window and acknowledgements;
* :mod:`.message_planner`: the one place that decides what a stream's next message carries
  (window, batches and bytes per message, linger, shared-memory ring placement);
* :mod:`.ring`: the shared-memory rings.

It never imports gRPC or protobuf (a test enforces it).
"""
