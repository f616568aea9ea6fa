#!/usr/bin/env python3
"""Data-parallel training through MXNet's parameter servers (examples/mxnet-ps.yaml).

The webhook gives every pod the DMLC_* variables. MXNet reads DMLC_ROLE when it is imported: in the scheduler and
the servers, `import mxnet` runs that role until the workers are done and then exits the process, so one script
serves every role. The workers train a small Gluon model on random data; the dist_sync kvstore sums their
gradients on the servers. Not run on this project's machines (no MXNet build for them); the local e2e test runs
the same DMLC_* contract with examples/scripts/dmlc_roles.py.
"""
import argparse
import os

import mxnet as mx  # the scheduler and the servers never return from this import
from mxnet import autograd, gluon, nd


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=64)
    args = p.parse_args()

    kv = mx.kv.create("dist_sync")
    ctx = mx.gpu(0) if mx.context.num_gpus() > 0 else mx.cpu()
    net = gluon.nn.Sequential()
    net.add(gluon.nn.Dense(64, activation="relu"), gluon.nn.Dense(1))
    net.initialize(mx.init.Xavier(), ctx=ctx)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01}, kvstore=kv)
    loss_fn = gluon.loss.L2Loss()
    mx.random.seed(0)  # one target for every worker
    w = nd.random.normal(shape=(32, 1), ctx=ctx)
    # Each worker its own data (a real job shards its dataset by kv.rank of kv.num_workers).
    mx.random.seed(1 + kv.rank)
    for epoch in range(args.epochs):
        total = 0.0
        for _ in range(50):
            x = nd.random.normal(shape=(args.batch_size, 32), ctx=ctx)
            y = nd.dot(x, w)
            with autograd.record():
                loss = loss_fn(net(x), y)
            loss.backward()
            trainer.step(args.batch_size)
            total += loss.mean().asscalar()
        print(f"worker={kv.rank}/{kv.num_workers} epoch={epoch} loss={total / 50:.4f} "
              f"role={os.environ.get('DMLC_ROLE')}", flush=True)


if __name__ == "__main__":
    main()
