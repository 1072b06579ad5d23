# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_flexnode_global_optspecs
    string join \n state= h/help V/version
end

function __fish_flexnode_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_flexnode_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_flexnode_using_subcommand
    set -l cmd (__fish_flexnode_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c flexnode -n "__fish_flexnode_needs_command" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_needs_command" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_needs_command" -s V -l version -d 'Print version'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "daemon" -d 'Run the node agent (reconciles Machine and MachineOperations)'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "join" -d 'Join this host to the cluster (again: converge). Exit 78: a setting cannot work'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "preflight" -d 'Run every check `join` makes before it changes anything, each with its fix'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "ignition" -d 'Render a container install\'s first boot (Butane and Ignition, 0600) from a join config'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "reset" -d 'Remove this node\'s machines, runtime files, units and links, and stop the agent'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "recover-agent-upgrade" -d 'Restore the last-good agent after a failed upgrade (run by the recovery unit)'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "host-exec" -d 'Run a host program with the host\'s root as `/` (the container install\'s agent, for what only the host\'s own tools do: src/effects/host/exec.rs)'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "status" -d 'Show the node\'s state; works while the daemon is stopped'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "history" -d 'Print the transition journal'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "op" -d 'Create and inspect MachineOperations'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "rollout" -d 'Run an operation on every node a selector matches, in waves; resumable'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "approver" -d 'Approve the certificate requests of agents whose bootstrap token is bound to their node (or who renew their own identity); deny the rest asking for an agent identity'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "token" -d 'An exec credential plugin: print an `ExecCredential` with a token from an identity provider (a kubeconfig\'s user runs `flexnode token …`)'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "completions" -d 'Print the shell completion script for SHELL (also in the repository\'s completions/)'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "version" -d 'Print the version'
complete -c flexnode -n "__fish_flexnode_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c flexnode -n "__fish_flexnode_using_subcommand daemon" -l config -d 'The configuration `flexnode join` installed' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand daemon" -l node -d 'With `--simulated-host`: this node\'s name (= the Kubernetes Node and the Machine)' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand daemon" -l kubeconfig -d 'With `--simulated-host`: the agent\'s credential' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand daemon" -l tick-ms -d 'How often deadlines, TTLs and waiting work are looked at, in milliseconds' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand daemon" -l metrics-address -d 'Serve Prometheus metrics at http://ADDR/metrics (loopback only; overrides the configuration\'s `metricsAddress`)' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand daemon" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand daemon" -l simulated-host -d 'Run against an in-memory simulated host (labs and demos): units, machines and agent builds are simulated; the store and the API server are real'
complete -c flexnode -n "__fish_flexnode_using_subcommand daemon" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand join" -l config -d 'YAML or JSON; see docs/config.md' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand join" -l ignore-preflight-errors -d 'Preflight checks whose failure does not stop the join (NAME,…; `all`)' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand join" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand join" -l backoff -d 'After failed attempts, wait a growing delay first (10 s doubling to 300 s; exit 78 and success start over): the bootstrap units\' retries'
complete -c flexnode -n "__fish_flexnode_using_subcommand join" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand preflight" -l config -d 'The join configuration; see docs/config.md' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand preflight" -s o -l output -r -f -a "human\t''
json\t''
yaml\t''"
complete -c flexnode -n "__fish_flexnode_using_subcommand preflight" -l ignore-preflight-errors -d 'Checks whose failure is reported as ignored (NAME,…; `all`)' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand preflight" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand preflight" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand ignition" -l config -d 'The join config (installMode: container, agentImage, agentImageDigest); see docs/container-install.md' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand ignition" -l out -d 'Where config.bu and config.ign are written (created 0700)' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand ignition" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand ignition" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand reset" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand reset" -l yes -d 'Confirm'
complete -c flexnode -n "__fish_flexnode_using_subcommand reset" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand recover-agent-upgrade" -l message -r
complete -c flexnode -n "__fish_flexnode_using_subcommand recover-agent-upgrade" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand recover-agent-upgrade" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand host-exec" -l root -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand host-exec" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand host-exec" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand status" -s o -l output -r -f -a "human\t''
json\t''
yaml\t''"
complete -c flexnode -n "__fish_flexnode_using_subcommand status" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand status" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand history" -l limit -d 'How many of the newest entries' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand history" -s o -l output -r -f -a "human\t''
json\t''
yaml\t''"
complete -c flexnode -n "__fish_flexnode_using_subcommand history" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand history" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and not __fish_seen_subcommand_from create list get help" -l kubeconfig -d 'Kubeconfig to use [default: $KUBECONFIG, else ~/.kube/config]' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and not __fish_seen_subcommand_from create list get help" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and not __fish_seen_subcommand_from create list get help" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and not __fish_seen_subcommand_from create list get help" -f -a "create" -d 'Create a MachineOperation'
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and not __fish_seen_subcommand_from create list get help" -f -a "list" -d 'List MachineOperations'
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and not __fish_seen_subcommand_from create list get help" -f -a "get" -d 'Show one MachineOperation'
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and not __fish_seen_subcommand_from create list get help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -l node -d 'Target node by name' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -l selector -d 'Target nodes by labels: k=v[,k2=v2]' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -l image -d 'Upgrade (container install) to this image: oci://REGISTRY/REPO[:TAG]' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -l digest -d 'The image\'s digest: sha256:HEX' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -l url -d 'Upgrade (host install) from this archive URL' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -l sha256 -d 'The archive\'s SHA-256 (hex)' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -l drain-timeout -d 'How long the drain may take (90s, 10m, 1h30m) [default: the agent\'s, 10m]' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -l drain-on-timeout -d 'At the drain\'s timeout: Fail the operation, or Proceed with the pods left' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -l ttl -d 'Delete the object this long after it finished (1h, 30m, 90s, 3600)' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -l name -d 'Object name [default: <kind>-<node|sel>-<unix seconds>]' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -l timeout -d 'Give up waiting after this long (exit 3) [default: 10m]' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -l kubeconfig -d 'Kubeconfig to use [default: $KUBECONFIG, else ~/.kube/config]' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -l no-drain -d 'No drain: the pods are taken down with the machine (for a node drained already)'
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -l wait -d 'Follow the operation until it completes or fails'
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from create" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from list" -l node -d 'Only operations addressed to this node by name' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from list" -s o -l output -r -f -a "human\t''
json\t''
yaml\t''"
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from list" -l kubeconfig -d 'Kubeconfig to use [default: $KUBECONFIG, else ~/.kube/config]' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from list" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from list" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from get" -s o -l output -r -f -a "human\t''
json\t''
yaml\t''"
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from get" -l kubeconfig -d 'Kubeconfig to use [default: $KUBECONFIG, else ~/.kube/config]' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from get" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from get" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from help" -f -a "create" -d 'Create a MachineOperation'
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from help" -f -a "list" -d 'List MachineOperations'
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from help" -f -a "get" -d 'Show one MachineOperation'
complete -c flexnode -n "__fish_flexnode_using_subcommand op; and __fish_seen_subcommand_from help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l selector -d 'The nodes: every Machine with these labels, k=v[,k2=v2]' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l image -d 'Upgrade (container install) to this image: oci://REGISTRY/REPO[:TAG]' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l digest -d 'The image\'s digest: sha256:HEX' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l url -d 'Upgrade (host install) from this archive URL' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l sha256 -d 'The archive\'s SHA-256 (hex)' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l drain-timeout -d 'How long the drain may take (90s, 10m, 1h30m) [default: the agent\'s, 10m]' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l drain-on-timeout -d 'At the drain\'s timeout: Fail the operation, or Proceed with the pods left' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l max-unavailable -d 'How many nodes go at once: a count, or a percent of the nodes (rounded up)' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l name -d 'The rollout\'s name (a DNS label) [default: <kind>-<unix seconds>]' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l resume -d 'Go on with the stopped (or abandoned) rollout NAME from where it stopped' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l wave-timeout -d 'Stop when a wave has not finished after this long (exit 3; resumable)' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l namespace -d 'The namespace of the rollout\'s ConfigMap' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l kubeconfig -d 'Kubeconfig to use [default: $KUBECONFIG, else ~/.kube/config]' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l no-drain -d 'No drain: the pods are taken down with the machine (for a node drained already)'
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -l dry-run -d 'Print the waves and create nothing'
complete -c flexnode -n "__fish_flexnode_using_subcommand rollout" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand approver" -l kubeconfig -d 'The approver\'s credential; without it, the pod\'s service account' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand approver" -l metrics-address -d 'Serve Prometheus metrics at `http://ADDR/metrics` (`flexnode_approver_decisions_total`)' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand approver" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand approver" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand token" -l token-url -d 'An OAuth 2 token endpoint (client-credentials grant: a service principal\'s shape)' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand token" -l client-id -d 'The client ID sent to --token-url' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand token" -l client-secret-file -d 'The client secret, in a file only its owner may read (0600); never an argument' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand token" -l metadata-url -d 'A metadata endpoint on the node (a managed identity\'s shape: `GET URL?resource=AUDIENCE` with `Metadata: true`)' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand token" -l audience -d 'Whom the token is for: the API server\'s JWT authenticator maps it (`kubelet`: the node\'s kubelet; otherwise the agent)' -r
complete -c flexnode -n "__fish_flexnode_using_subcommand token" -l ca-file -d 'A CA (PEM) the provider\'s certificate is checked against, besides the system\'s' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand token" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand token" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand completions" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand completions" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand version" -l state -d 'The node\'s state store' -r -F
complete -c flexnode -n "__fish_flexnode_using_subcommand version" -s h -l help -d 'Print help'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "daemon" -d 'Run the node agent (reconciles Machine and MachineOperations)'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "join" -d 'Join this host to the cluster (again: converge). Exit 78: a setting cannot work'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "preflight" -d 'Run every check `join` makes before it changes anything, each with its fix'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "ignition" -d 'Render a container install\'s first boot (Butane and Ignition, 0600) from a join config'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "reset" -d 'Remove this node\'s machines, runtime files, units and links, and stop the agent'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "recover-agent-upgrade" -d 'Restore the last-good agent after a failed upgrade (run by the recovery unit)'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "host-exec" -d 'Run a host program with the host\'s root as `/` (the container install\'s agent, for what only the host\'s own tools do: src/effects/host/exec.rs)'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "status" -d 'Show the node\'s state; works while the daemon is stopped'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "history" -d 'Print the transition journal'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "op" -d 'Create and inspect MachineOperations'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "rollout" -d 'Run an operation on every node a selector matches, in waves; resumable'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "approver" -d 'Approve the certificate requests of agents whose bootstrap token is bound to their node (or who renew their own identity); deny the rest asking for an agent identity'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "token" -d 'An exec credential plugin: print an `ExecCredential` with a token from an identity provider (a kubeconfig\'s user runs `flexnode token …`)'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "completions" -d 'Print the shell completion script for SHELL (also in the repository\'s completions/)'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "version" -d 'Print the version'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and not __fish_seen_subcommand_from daemon join preflight ignition reset recover-agent-upgrade host-exec status history op rollout approver token completions version help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and __fish_seen_subcommand_from op" -f -a "create" -d 'Create a MachineOperation'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and __fish_seen_subcommand_from op" -f -a "list" -d 'List MachineOperations'
complete -c flexnode -n "__fish_flexnode_using_subcommand help; and __fish_seen_subcommand_from op" -f -a "get" -d 'Show one MachineOperation'
