package localfs;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.FileSystemException;
import java.nio.file.Files;
import java.nio.file.NoSuchFileException;
import java.util.Iterator;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import io.delta.storage.HadoopFileSystemLogStore;

/**
 * Delta's log store for {@code file:} paths ({@code spark.delta.logStore.file.impl}) that keeps
 * its contract across processes: a commit file is created only if absent.
 *
 * <p>Delta's default for local paths, LocalLogStore, checks that version N does not exist and
 * then renames its temporary file onto it, holding a lock only within its own JVM. A local
 * rename replaces an existing file, so when two processes commit version N of one table at
 * once (run-silver and run-gold both append to the ops tables) the later rename silently
 * replaces the earlier commit, and its {@code .crc} sidecar can come from the other writer, so
 * that the file then fails its checksum on every read. Here the temporary file is published by
 * a hard link instead: {@code link(2)} fails if the name exists, which Delta turns into a retry
 * at N+1, as on a store with put-if-absent. delta-rs commits to local paths the same way.
 *
 * <p>Overwrites ({@code _last_checkpoint}) and file systems without hard links keep
 * LocalLogStore's behaviour.
 */
public class LinkLogStore extends HadoopFileSystemLogStore {
  private static final Logger LOG = LoggerFactory.getLogger(LinkLogStore.class);
  private volatile boolean linksWork = true;

  public LinkLogStore(Configuration hadoopConf) {
    super(hadoopConf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite,
                    Configuration hadoopConf) throws IOException {
    FileSystem fs = path.getFileSystem(hadoopConf);
    if (overwrite || !linksWork || !(fs instanceof LocalFileSystem)) {
      synchronized (this) {
        writeWithRename(path, actions, overwrite, hadoopConf);
      }
      return;
    }
    LocalFileSystem local = (LocalFileSystem) fs;
    if (!fs.exists(path.getParent())) {
      throw new FileNotFoundException("No such file or directory: " + path.getParent());
    }
    if (fs.exists(path)) {
      throw new FileAlreadyExistsException(path.toString());
    }
    Path temp = createTempPath(path);
    boolean published = false;
    try {
      try (FSDataOutputStream out = fs.create(temp, false)) {
        while (actions.hasNext()) {
          out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
        }
      }
      try {
        Files.createLink(local.pathToFile(path).toPath(), local.pathToFile(temp).toPath());
      } catch (FileAlreadyExistsException e) {
        throw new FileAlreadyExistsException(path.toString());
      } catch (UnsupportedOperationException | FileSystemException e) {
        if (e instanceof NoSuchFileException) {
          throw e;
        }
        // A mount without hard links (vfat, some network shares): one process per table only.
        LOG.warn("Hard links fail under {} ({}); Delta commits there are safe from one process "
            + "only, as with Delta's LocalLogStore", path.getParent(), e.toString());
        linksWork = false;
        synchronized (this) {
          if (fs.exists(path)) {
            throw new FileAlreadyExistsException(path.toString());
          }
          if (!fs.rename(temp, path)) {
            throw new IOException("Cannot rename " + temp + " to " + path);
          }
        }
        published = true;
        return;
      }
      published = true;
      // Only the writer whose link won moves its checksum beside the commit; a losing writer's
      // checksum leaves with its temporary file, so the two always come from one writer.
      FileSystem raw = local.getRawFileSystem();
      try {
        raw.rename(local.getChecksumFile(temp), local.getChecksumFile(path));
        raw.delete(temp, false);
      } catch (IOException e) {
        // The commit is in place (a commit without its checksum reads unchecked): reporting it
        // failed now would have Delta retry a commit that happened.
        LOG.warn("Delta commit {} is written; tidying its temporary file failed: {}", path, e.toString());
      }
    } finally {
      if (!published) {
        fs.delete(temp, false);
      }
    }
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) {
    return true;
  }
}
