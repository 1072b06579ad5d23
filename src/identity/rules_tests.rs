use super::*;
use rcgen::{
    CertificateParams, DistinguishedName, DnType, KeyPair, PKCS_ECDSA_P256_SHA256,
    PKCS_ECDSA_P384_SHA384, PKCS_ED25519, SignatureAlgorithm,
};

fn csr(alg: &'static SignatureAlgorithm, subject: &[(DnType, &str)], sans: &[&str]) -> String {
    let key = KeyPair::generate_for(alg).expect("key");
    let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .expect("params");
    let mut dn = DistinguishedName::new();
    for (t, v) in subject {
        dn.push(t.clone(), *v);
    }
    params.distinguished_name = dn;
    params
        .serialize_request(&key)
        .expect("request")
        .pem()
        .expect("pem")
}

fn agent(node: &str) -> String {
    csr(
        &PKCS_ECDSA_P256_SHA256,
        &[
            (DnType::CommonName, &format!("system:flexnode:{node}")),
            (DnType::OrganizationName, "flexnode:agents"),
        ],
        &[],
    )
}

fn groups(g: &[&str]) -> Vec<String> {
    g.iter().map(|s| s.to_string()).collect()
}

const TOKEN_USER: &str = "system:bootstrap:abcdef";

fn judged(pem: &str, user: &str, groups: &[String], usages: &[&str]) -> Verdict {
    let usages: Vec<String> = usages.iter().map(|s| s.to_string()).collect();
    judge(&Request {
        signer: SIGNER,
        username: user,
        groups,
        usages: &usages,
        pem: pem.as_bytes(),
    })
}

fn reason(v: &Verdict) -> &'static str {
    match v {
        Verdict::NotOurs => "NotOurs",
        Verdict::Approve { reason, .. } | Verdict::Deny { reason, .. } => reason,
    }
}

#[test]
fn a_token_bound_to_the_node_gets_that_nodes_identity_only() {
    let bound = groups(&[
        "system:bootstrappers",
        "system:bootstrappers:flexnode:node-a",
    ]);
    let ok = judged(&agent("node-a"), TOKEN_USER, &bound, &["client auth"]);
    assert_eq!(reason(&ok), "BoundBootstrapToken", "{ok:?}");
    let other = judged(&agent("node-b"), TOKEN_USER, &bound, &["client auth"]);
    assert_eq!(reason(&other), "RequesterNotBound", "{other:?}");
    let Verdict::Deny { message, .. } = other else {
        unreachable!()
    };
    assert!(message.contains("node node-b"), "{message}");
    // Any bootstrap token is not enough: the kubelet's (group system:bootstrappers only).
    let unbound = groups(&["system:bootstrappers"]);
    let v = judged(&agent("node-a"), TOKEN_USER, &unbound, &["client auth"]);
    assert_eq!(reason(&v), "RequesterNotBound");
    // The bound group from a user who is no bootstrap token (groups are the API server's,
    // but a user could be put in any group by another authenticator).
    let v = judged(&agent("node-a"), "mallory", &bound, &["client auth"]);
    assert_eq!(reason(&v), "RequesterNotBound");
}

#[test]
fn an_agent_renews_its_own_identity_and_no_other() {
    let agents = groups(&["flexnode:agents", "system:authenticated"]);
    let usages = ["client auth", "digital signature", "key encipherment"];
    let v = judged(&agent("node-a"), "system:flexnode:node-a", &agents, &usages);
    assert_eq!(reason(&v), "Renewal", "{v:?}");
    let v = judged(&agent("node-b"), "system:flexnode:node-a", &agents, &usages);
    assert_eq!(reason(&v), "RequesterNotBound");
    let v = judged(
        &agent("node-a"),
        "system:flexnode:node-a",
        &groups(&[]),
        &usages,
    );
    assert_eq!(reason(&v), "RequesterNotBound");
}

#[test]
fn only_the_agents_shape_is_approved() {
    let bound = groups(&["system:bootstrappers:flexnode:node-a"]);
    let cn = "system:flexnode:node-a";
    let cases: Vec<(&str, String, Vec<&str>)> = vec![
        (
            "BadSubject",
            csr(
                &PKCS_ECDSA_P256_SHA256,
                &[
                    (DnType::CommonName, cn),
                    (DnType::OrganizationName, "flexnode:agents"),
                    (DnType::OrganizationName, "system:masters"),
                ],
                &[],
            ),
            vec!["client auth"],
        ),
        (
            "BadSubject",
            csr(
                &PKCS_ECDSA_P256_SHA256,
                &[
                    (DnType::CommonName, cn),
                    (DnType::OrganizationName, "flexnode:agents"),
                    (DnType::OrganizationalUnitName, "x"),
                ],
                &[],
            ),
            vec!["client auth"],
        ),
        (
            "BadSubject",
            csr(
                &PKCS_ECDSA_P256_SHA256,
                &[(DnType::CommonName, "system:flexnode:Not_A_Name")],
                &[],
            ),
            vec!["client auth"],
        ),
        (
            "BadSubject",
            csr(&PKCS_ECDSA_P256_SHA256, &[(DnType::CommonName, cn)], &[]),
            vec!["client auth"],
        ),
        (
            "BadExtensions",
            csr(
                &PKCS_ECDSA_P256_SHA256,
                &[
                    (DnType::CommonName, cn),
                    (DnType::OrganizationName, "flexnode:agents"),
                ],
                &["node-a.example"],
            ),
            vec!["client auth"],
        ),
        ("BadUsages", agent("node-a"), vec!["server auth"]),
        (
            "BadUsages",
            agent("node-a"),
            vec!["client auth", "server auth"],
        ),
        ("BadUsages", agent("node-a"), vec![]),
    ];
    for (want, pem, usages) in cases {
        let v = judged(&pem, TOKEN_USER, &bound, &usages);
        assert_eq!(reason(&v), want, "{v:?}");
    }
    for alg in [&PKCS_ECDSA_P384_SHA384, &PKCS_ED25519] {
        let pem = csr(
            alg,
            &[
                (DnType::CommonName, cn),
                (DnType::OrganizationName, "flexnode:agents"),
            ],
            &[],
        );
        let v = judged(&pem, TOKEN_USER, &bound, &["client auth"]);
        assert_eq!(reason(&v), "BoundBootstrapToken", "{v:?}");
    }
    assert!(!KeyKind::Rsa(1024).allowed() && KeyKind::Rsa(2048).allowed());
    assert!(!KeyKind::Rsa(16384).allowed());
}

#[test]
fn requests_for_no_agent_identity_are_not_the_approvers() {
    let bound = groups(&["system:bootstrappers:flexnode:node-a"]);
    // The kubelet's own request.
    let kubelet = csr(
        &PKCS_ECDSA_P256_SHA256,
        &[
            (DnType::CommonName, "system:node:node-a"),
            (DnType::OrganizationName, "system:nodes"),
        ],
        &[],
    );
    assert_eq!(
        judged(&kubelet, TOKEN_USER, &bound, &["client auth"]),
        Verdict::NotOurs
    );
    // An agent's shape for another signer (the kubelet's: its signer checks it).
    let usages = groups(&["client auth"]);
    let v = judge(&Request {
        signer: "kubernetes.io/kube-apiserver-client-kubelet",
        username: TOKEN_USER,
        groups: &bound,
        usages: &usages,
        pem: agent("node-a").as_bytes(),
    });
    assert_eq!(v, Verdict::NotOurs);
    // Only the group, under another name: still an agent identity, denied.
    let group_only = csr(
        &PKCS_ECDSA_P256_SHA256,
        &[
            (DnType::CommonName, "admin"),
            (DnType::OrganizationName, "flexnode:agents"),
        ],
        &[],
    );
    let v = judged(&group_only, TOKEN_USER, &bound, &["client auth"]);
    assert_eq!(reason(&v), "BadSubject");
    assert_eq!(
        judged("not a request", TOKEN_USER, &bound, &["client auth"]),
        Verdict::NotOurs
    );
}
