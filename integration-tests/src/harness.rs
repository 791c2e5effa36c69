//! What every real-Envoy test and tool stands on: the Envoy process
//! ([`envoy`]), the simulated upstream hosts ([`sim`], with its precise
//! [`timer`]) and the load generators ([`load`]).

pub mod envoy;
pub mod load;
pub mod sim;
pub mod timer;

/// A directory removed when it goes out of scope, whether the test or
/// tool that made it passed or not.
pub struct RemoveOnDrop(pub std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes `text` to `path` the way a control plane's file delivery does
/// (a new file moved into place), so that an Envoy watching the directory
/// never reads half a file.
pub fn replace_file(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}
