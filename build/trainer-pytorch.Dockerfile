# A training image for real clusters: PyTorch with torchrun, plus python-etcd, which both of torch's etcd
# rendezvous backends ("etcd" and "etcd-v2") import but torch does not depend on. The local test cluster
# uses local/hostrt:1 (the host's Debian python3-torch through read-only hostPath mounts) instead.
#   docker build -f build/trainer-pytorch.Dockerfile -t REGISTRY/trainer-pytorch:VERSION .
# CUDA: start from a pytorch/pytorch:*-cuda* image instead; the rest is the same.
ARG PYTORCH_IMAGE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
FROM ${PYTORCH_IMAGE}
# python-etcd 0.4.5 is known to work with urllib3 1.26 (Debian bookworm's pair, the one our tests use);
# newer urllib3 2.x is reported (not verified here) to break it, so pin 1.26.
RUN pip install --no-cache-dir "python-etcd==0.4.5" "urllib3>=1.26,<2"
# Mounted read-only by the webhook: the hostfile, discover_hosts.sh and the sidecar binary.
ENV PATH=/etc/elastic-training:$PATH
WORKDIR /workspace
ENTRYPOINT ["torchrun"]
