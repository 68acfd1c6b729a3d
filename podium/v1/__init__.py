"""Generated protobuf and gRPC code for podium.v1. Do not edit: run scripts/gen_protos.sh."""
