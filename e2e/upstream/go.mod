// The upstream agent's CRDs at the version the AKS Flex Node agent pins; only downloaded
// (tests/core/upstream_crds.rs), never built.
module flexnode.test/upstream

go 1.22

require github.com/Azure/unbounded v0.1.22
