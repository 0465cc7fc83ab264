#![forbid(unsafe_code)]
fn main() {
    print!("{}", lanekeeper::api::crds_yaml());
}
