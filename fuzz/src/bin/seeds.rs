//! Writes the seed corpora (`fuzz/src/seeds.rs`) under the directory given, one folder per
//! target: `seeds DIR`.

fn main() {
    let Some(dir) = std::env::args_os().nth(1) else {
        eprintln!("usage: seeds DIR");
        std::process::exit(2);
    };
    let dir = std::path::PathBuf::from(dir);
    for seed in flexnode_fuzz::seeds::all() {
        let target = dir.join(seed.target);
        if let Err(e) = std::fs::create_dir_all(&target)
            .and_then(|()| std::fs::write(target.join(&seed.name), &seed.data))
        {
            eprintln!("seeds: {}: {e}", target.display());
            std::process::exit(1);
        }
    }
}
