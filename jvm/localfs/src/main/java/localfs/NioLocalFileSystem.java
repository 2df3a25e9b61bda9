package localfs;

import org.apache.hadoop.fs.LocalFileSystem;

/** {@code fs.file.impl}: Hadoop's LocalFileSystem (checksums included) over
 * {@link NioRawLocalFileSystem}. */
public class NioLocalFileSystem extends LocalFileSystem {
  public NioLocalFileSystem() {
    super(new NioRawLocalFileSystem());
  }
}
