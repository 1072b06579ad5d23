// The upstream Ignition tools the container install is checked with: ignition-validate (the
// rendered config is valid Ignition) and ignition (its files stage applied to a guest's root).
// Built by ./build from these pinned modules; nothing is committed.
module flexnode.test/ignition

go 1.24.0

require github.com/coreos/ignition/v2 v2.24.0

require (
	github.com/aws/aws-sdk-go-v2 v1.39.2 // indirect
	github.com/coreos/go-json v0.0.0-20230131223807-18775e0fb4fb // indirect
	github.com/coreos/go-semver v0.3.1 // indirect
	github.com/coreos/go-systemd/v22 v22.6.0 // indirect
	github.com/coreos/vcontext v0.0.0-20230201181013-d72178a18687 // indirect
	github.com/vincent-petithory/dataurl v1.0.0 // indirect
)
